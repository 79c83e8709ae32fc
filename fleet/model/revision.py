"""A model's revision: a git commit, a hub snapshot name, or a hash of the files that shape outputs."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fleet.model.modeldir import CONFIG_FILES, TOKENIZER_FILES, WEIGHT_SUFFIXES


def model_revision(model_dir: Path) -> str:
    """A git commit or hub snapshot name when there is one, else a hash of the model's files.

    The hash covers config, generation config, tokenizer files and the weight files' names
    and sizes (reading every weight byte of a 27B model at enqueue would take minutes).
    """
    commit = _git_commit(model_dir)
    if commit:
        return commit
    if model_dir.parent.name == "snapshots" and len(model_dir.name) == 40:
        return model_dir.name
    digest = hashlib.sha256()
    for name in (*CONFIG_FILES, *TOKENIZER_FILES):
        path = model_dir / name
        if path.is_file():
            digest.update(f"{name}\0".encode())
            digest.update(path.read_bytes())
    for path in sorted(model_dir.iterdir()):
        if path.name.endswith(WEIGHT_SUFFIXES) and path.is_file():
            digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
    return "sha256:" + digest.hexdigest()


def _git_commit(model_dir: Path) -> str | None:
    head = model_dir / ".git" / "HEAD"
    if not head.is_file():
        return None
    ref = head.read_text().strip()
    if not ref.startswith("ref: "):
        return ref or None
    ref_path = model_dir / ".git" / ref[5:]
    if ref_path.is_file():
        return ref_path.read_text().strip()
    packed = model_dir / ".git" / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref[5:]:
                return sha
    return None
