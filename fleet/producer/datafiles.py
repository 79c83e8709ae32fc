"""Which files of a dataset hold one config's split (docs/architecture.md, Records), chosen from its
file listing as the Hub and `datasets` choose them, before anything large is read or downloaded:

- a `save_to_disk` folder: `dataset_dict.json` names the splits, each split's `state.json` its
  Arrow files, in order (a single Dataset: `state.json` at the top);
- a dataset card (README.md) whose YAML header lists `configs`, each with `data_files` (a
  pattern, a list of them, or a list of {split, path});
- else the Hub's own layout: a config is a folder (none for the default config), and a split's
  files are `data/<split>-*`, `data/<split>/*`, `<split>-*`, `<split>.*` or `<split>/*` in it
  (the Parquet converter's `<config>/<split>/*.parquet` too); with no file named after any
  split, every data file is the train split.

Files of a split are read in name order, which the Hub's shard names
(`train-00000-of-00004.parquet`) make the dataset's order.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fleet.errors import ConfigError
from fleet.store.schemes import Listing

#: the files a dataset's rows may be in, by ending
DATA_SUFFIXES = (".parquet", ".pq", ".arrow", ".jsonl", ".json")
#: split names the Hub recognises in file names when a card lists none
KNOWN_SPLITS = ("train", "validation", "valid", "dev", "test", "eval")


def glob_re(pattern: str) -> re.Pattern[str]:
    """The Hub's glob: `*` and `?` stay within a folder, `**` crosses folders."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _matching(files: list[str], patterns: list[str]) -> list[str]:
    compiled = [glob_re(p.lstrip("/")) for p in patterns]
    return sorted(f for f in files if f.endswith(DATA_SUFFIXES) and any(c.fullmatch(f) for c in compiled))


def _saved(listing: Listing, folder: str) -> list[str]:
    """The Arrow files a `save_to_disk` state.json lists, in order."""
    state = json.loads(listing.text(f"{folder}state.json"))
    return [f"{folder}{entry['filename']}" for entry in state.get("_data_files", [])]


def card_configs(text: str) -> list[dict[str, Any]]:
    """The `configs` of a dataset card's YAML header (none without a header)."""
    import yaml

    if not text.startswith("---"):
        return []
    header = text.split("\n---", 1)[0].removeprefix("---")
    try:
        meta = yaml.safe_load(header) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"README.md: its YAML header does not parse ({e})") from e
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _split_patterns(data_files: Any) -> dict[str, list[str]]:
    """A card config's data_files as split -> patterns (a bare pattern or list is the train split)."""
    if isinstance(data_files, str):
        return {"train": [data_files]}
    out: dict[str, list[str]] = {}
    for entry in data_files or []:
        if isinstance(entry, str):
            out.setdefault("train", []).append(entry)
        elif isinstance(entry, dict):
            path = entry.get("path", [])
            out.setdefault(str(entry.get("split", "train")), []).extend([path] if isinstance(path, str) else path)
    return out


def _from_card(files: list[str], configs: list[dict[str, Any]], config: str | None, split: str) -> list[str]:
    names = [str(c.get("config_name", "default")) for c in configs]
    if config is None:
        chosen = next((c for c in configs if c.get("default")), None) or next(
            (c for c in configs if c.get("config_name", "default") == "default"), None)
        if chosen is None and len(configs) == 1:
            chosen = configs[0]
        if chosen is None:
            raise ConfigError(f"the dataset has configs {', '.join(names)} and none is the default: give --config")
    else:
        chosen = next((c for c in configs if str(c.get("config_name", "default")) == config), None)
        if chosen is None:
            raise ConfigError(f"the dataset has no config {config!r}; its configs: {', '.join(names)}")
    splits = _split_patterns(chosen.get("data_files"))
    if split not in splits:
        raise ConfigError(f"config {chosen.get('config_name', 'default')!r} has no split {split!r}; "
                          f"its splits: {', '.join(splits) or 'none'}")
    found = _matching(files, splits[split])
    if not found:
        raise ConfigError(f"split {split!r}: no data file matches {', '.join(splits[split])}")
    return found


def _from_layout(files: list[str], config: str | None, split: str) -> list[str]:
    base = f"{config}/" if config not in (None, "default") else ""
    data = [f for f in files if f.startswith(base) and f.endswith(DATA_SUFFIXES) and "/." not in f"/{f}"]
    if base and not data:
        folders = sorted({f.split("/", 1)[0] for f in files if "/" in f and f.endswith(DATA_SUFFIXES)})
        raise ConfigError(f"the dataset has no config {config!r} (no data files under {base}); "
                          f"folders with data files: {', '.join(folders) or 'none'}")

    def patterns(s: str) -> list[str]:
        return [f"{base}data/{s}-*", f"{base}data/{s}/**", f"{base}{s}-*", f"{base}{s}.*", f"{base}{s}/**",
                f"{base}*/{s}/**", f"{base}data/{s}.*"]

    found = _matching(data, patterns(split))
    if found:
        return found
    named = {s for s in KNOWN_SPLITS if _matching(data, patterns(s))}
    if not named and split == "train" and data:
        return sorted(data)
    raise ConfigError(f"no data files for split {split!r}" + (f"; splits found: {', '.join(sorted(named))}"
                                                             if named else "; the dataset holds no data files"))


def select(listing: Listing, config: str | None, split: str) -> list[str]:
    """The files of `config`'s `split`, in the order their rows are read; ConfigError naming
    what the dataset has instead."""
    files = sorted(listing.files)
    present = set(files)
    if "dataset_dict.json" in present:
        splits = list(json.loads(listing.text("dataset_dict.json")).get("splits", []))
        if split not in splits:
            raise ConfigError(f"the saved dataset has no split {split!r}; its splits: {', '.join(splits)}")
        return _saved(listing, f"{split}/")
    if "state.json" in present:
        return _saved(listing, "")
    configs = card_configs(listing.text("README.md")) if "README.md" in present else []
    if configs:
        return _from_card(files, configs, config, split)
    return _from_layout(files, config, split)
