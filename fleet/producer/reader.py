"""Read and validate the JSONL input (docs/architecture.md, Records) in the three forms it may take.

Validation is one streaming pass that reports every bad line before anything is
enqueued; reading is a second pass. Both go through `parse_line`, so a line that
validates is exactly a line that reads. Memory stays flat in the input size: the only
thing kept across lines is an 8-byte digest and a line number per id, to find duplicates.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleet.errors import InputUnusable
from fleet.producer.forms import check_input_ids, conversation_prompt, passthrough
from fleet.records import InputRecord, SamplingOverrides

SAMPLING_FIELDS = tuple(SamplingOverrides.model_fields)
_KNOWN = ", ".join(SAMPLING_FIELDS)
#: OpenAI batch body keys that name a sampling field differently.
BODY_ALIASES = {"max_completion_tokens": "max_tokens"}
#: OpenAI batch body keys with no effect here: the job, not the line, picks the model.
BODY_IGNORED = frozenset({"model", "user", "metadata", "store", "stream"})
#: A record's prompt comes in exactly one of these (or in an OpenAI batch line's body).
PROMPT_FORMS = ("messages", "prompt", "input_ids", "conversations")
SAMPLING_KEYS = frozenset(SAMPLING_FIELDS) | frozenset(BODY_ALIASES)
#: The form a record came in, by where its prompt was found (its `where` path).
FORMS = {"body.messages": "openai batch (messages)", "body.prompt": "openai batch (prompt)"}
MAX_PROBLEMS_PER_LINE = 5
#: Deepest nesting of objects and arrays a line may have (the line's object is level 1).
#: Refused beyond it rather than accepted: pydantic's JSON serializer (the input digest)
#: stops at 255 levels of the record around it, json.dumps (chunks, results, exports) at
#: Python's recursion limit less a worker's stack; 128, serde_json's default, leaves every
#: encoder room, and real metadata nests a few levels.
MAX_DEPTH = 128
_BOM = b"\xef\xbb\xbf"
#: How a file that is not JSONL text begins: named once, not as every line's bad bytes.
NOT_TEXT = {
    b"\x1f\x8b": "gzip-compressed (decompress it first: gunzip)",
    b"\x28\xb5\x2f\xfd": "zstd-compressed (decompress it first: zstd -d)",
    b"BZh": "bzip2-compressed (decompress it first: bunzip2)",
    b"\xfd7zXZ\x00": "xz-compressed (decompress it first: unxz)",
    b"PK\x03\x04": "a zip archive (unzip it first)",
    b"\xff\xfe": "UTF-16 text (save it as UTF-8)",
    b"\xfe\xff": "UTF-16 text (save it as UTF-8)",
}


class BadLine(ValueError):
    """One line's problems, worded for the user (without the line number)."""

    def __init__(self, problems: list[str]):
        shown = problems[:MAX_PROBLEMS_PER_LINE]
        more = len(problems) - len(shown)
        super().__init__("; ".join(shown) + (f"; and {more} more" if more > 0 else ""))


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages a JSONL author recognises."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


class _Refused(ValueError):
    """A value the decoder's hooks refuse (a NaN, a number no float holds), worded for the user."""


def _reject_constant(name: str) -> Any:
    raise _Refused(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    # 1e400 reads as inf, which the chunk encoder would write as Infinity (not JSON) and
    # pydantic as null: refused here, so what validate accepts is what the chunks hold.
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is out of range (beyond a 64-bit float)")
    return value


# One decoder for every line: json.loads with an option builds a new one per call.
_JSON = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite)


def _too_deep(raw: bytes, obj: dict[str, Any]) -> str | None:
    """The first top-level field nesting deeper than MAX_DEPTH, if any. Only a line with more
    brackets than MAX_DEPTH can (quoted brackets included), so most lines cost two counts."""
    if raw.count(b"{") + raw.count(b"[") <= MAX_DEPTH:
        return None
    for key, value in obj.items():
        stack = [(value, 2)]  # the line's object is level 1
        while stack:
            item, level = stack.pop()
            if isinstance(item, dict | list):
                if level > MAX_DEPTH:
                    return key
                stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return None


def _decode(raw: bytes, line: int) -> dict[str, Any]:
    if line == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM) :]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadLine([f"not UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}"]) from e
    if "\0" in text:
        raise BadLine([f"NUL byte at column {text.index(chr(0)) + 1}: binary data, not a line of JSON text"])
    try:
        obj = _JSON.decode(text)
    except json.JSONDecodeError as e:
        column = min(e.pos, len(text.rstrip("\r\n"))) + 1  # not past the line's end
        # the decoder's own wording ends some messages in "at", before the position it omits
        raise BadLine([f"not JSON: {e.msg.removesuffix(' at')} at column {column}"]) from e
    except _Refused as e:
        raise BadLine([f"not JSON: {e}"]) from e
    except ValueError as e:  # the decoder's only other ValueError: int() refusing a huge integer
        limit = sys.get_int_max_str_digits()
        raise BadLine([f"not JSON: an integer has more than {limit} digits"]) from e
    except RecursionError as e:
        raise BadLine([f"nests deeper than {MAX_DEPTH} levels of objects and arrays"]) from e
    if not isinstance(obj, dict):
        raise BadLine([f"not a JSON object (got {_kind(obj)})"])
    deep = _too_deep(raw, obj)
    if deep is not None:
        raise BadLine([f"{deep}: nests deeper than {MAX_DEPTH} levels of objects and arrays"])
    if "\\u" in text:  # raw bytes passed UTF-8 above: a lone surrogate can only be an escape
        problems = list(_unencodable(obj, ""))
        if problems:
            raise BadLine(problems)
    return obj


def _unencodable(value: Any, path: str) -> Iterator[str]:
    """Strings JSON allows but UTF-8 cannot hold (lone surrogates such as "\\ud800"), by path."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            yield (f"{path or 'value'}: lone surrogate \\u{ord(value[e.start]):04x} at character "
                   f"{e.start + 1} cannot be encoded as UTF-8")
    elif isinstance(value, dict):
        for key, item in value.items():
            name = key if key.encode("utf-8", "surrogatepass").decode("utf-8", "replace") == key else ascii(key)
            at = f"{path}.{name}" if path else name
            yield from _unencodable(key, f"{at} (the key)")
            yield from _unencodable(item, at)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _unencodable(item, f"{path}[{i}]")


def _check_messages(value: Any, name: str, problems: list[str]) -> None:
    # Checked by hand: pydantic words a str|list union error as two errors on odd paths.
    if not isinstance(value, list) or not value:
        got = "an empty array" if value == [] else _kind(value)
        problems.append(f"{name}: must be a non-empty array of messages (got {got})")
        return
    for i, msg in enumerate(value):
        at = f"{name}[{i}]"
        if not isinstance(msg, dict):
            problems.append(f"{at}: must be an object with role and content (got {_kind(msg)})")
            continue
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            problems.append(f"{at}.role: must be a non-empty string (got {_kind(role)})")
        content = msg.get("content")
        if content is None and not msg.get("tool_calls"):
            problems.append(f"{at}.content: missing (a string or an array of parts)")
        elif content is not None and not isinstance(content, str | list):
            problems.append(f"{at}.content: must be a string or an array (got {_kind(content)})")


def _record_id(obj: dict[str, Any], line: int, problems: list[str]) -> str:
    key = "custom_id" if "custom_id" in obj else "id"
    value = obj.get(key)
    if value is None:
        return str(line)
    if isinstance(value, bool) or not isinstance(value, str | int):
        problems.append(f"{key}: must be a string or an integer (got {_kind(value)})")
    elif value == "":
        problems.append(f"{key}: must not be empty")
    return str(value)


def _sampling(
    obj: dict[str, Any], body: dict[str, Any] | None, where: dict[str, str], problems: list[str]
) -> dict[str, Any] | None:
    """Merge a batch body's sampling fields and the record's `sampling` object; `where`
    maps each field to the path the user wrote, so errors name it."""
    merged: dict[str, Any] = {}
    for key in obj:
        if key in SAMPLING_FIELDS or key in BODY_ALIASES:
            problems.append(f'{key}: sampling fields go inside "sampling"')
    for key, value in (body or {}).items():
        field = BODY_ALIASES.get(key, key)
        if key in ("messages", "prompt") or key in BODY_IGNORED:
            continue
        if field not in SAMPLING_FIELDS:
            problems.append(f"body.{key}: not supported (sampling fields: {_KNOWN})")
        elif field in merged:
            problems.append(f"body.{key}: also given as {where[field]}; give it once")
        else:
            merged[field], where[field] = value, f"body.{key}"
    own = obj.get("sampling")
    if own is not None and not isinstance(own, dict):
        problems.append(f"sampling: must be an object (got {_kind(own)})")
        own = None
    for key, value in (own or {}).items():
        if key in merged:
            problems.append(f"sampling.{key}: also given as {where[key]}; give it once")
        merged[key], where[key] = value, f"sampling.{key}"
    return merged or None


def _shape(
    obj: dict[str, Any], line: int, pos: int, vocab: int | None = None, turns: str = "last"
) -> tuple[dict[str, Any], dict[str, str]]:
    """The line in InputRecord's shape, and the user's name for each field."""
    problems: list[str] = []
    where = {"id": "custom_id" if "custom_id" in obj else "id"}
    body, src, prefix = None, obj, ""
    if "body" in obj:
        body = obj["body"]
        if not isinstance(body, dict):
            raise BadLine([f"body: must be an object (got {_kind(body)})"])
        src, prefix = body, "body."
        problems += [
            f"{k}: give it inside body, not beside it" for k in ("messages", "prompt") if k in obj
        ]
    data: dict[str, Any] = {"pos": pos, "line": line, "id": _record_id(obj, line, problems)}
    forms = ("messages", "prompt") if body is not None else PROMPT_FORMS
    has = [k for k in forms if src.get(k) is not None]
    if not has:
        if body is not None:
            problems.append("body has no messages or prompt; one is needed")
        else:
            problems.append(f"none of {', '.join(PROMPT_FORMS)} or body (an OpenAI batch line); one is needed")
    elif len(has) > 1:
        problems.append(f"both {prefix}{has[0]} and {prefix}{has[1]}; give one")
    elif has[0] == "messages":
        _check_messages(src["messages"], f"{prefix}messages", problems)
    elif has[0] == "input_ids":
        check_input_ids(src["input_ids"], vocab, problems)
    elif has[0] == "conversations":
        src = {"messages": conversation_prompt(src["conversations"], problems, whole=turns == "all")}
        has = ["messages"] if not problems else []
        if has:
            _check_messages(src["messages"], "conversations", problems)
    elif not isinstance(src["prompt"], str) or not src["prompt"]:
        problems.append(f"{prefix}prompt: must be a non-empty string (got {_kind(src['prompt'])})")
    for key in has:
        data[key], where[key] = src[key], f"{prefix}{key}"
    if "conversations" in obj and has:
        where["messages"] = "conversations"
    data["sampling"] = _sampling(obj, body, where, problems)
    data["extra"] = passthrough(obj, SAMPLING_KEYS, problems)
    if problems:
        raise BadLine(problems)
    return data, where


def _path_of(loc: tuple[Any, ...], where: dict[str, str]) -> str:
    head, rest = loc[0], loc[1:]
    if head == "sampling" and rest:
        head, rest = rest[0], rest[1:]
        base = where.get(head, f"sampling.{head}")
    else:
        base = where.get(head, str(head))
    return base + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest)


def _explain(error: ValidationError, where: dict[str, str]) -> BadLine:
    problems = []
    for err in error.errors(include_url=False):
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"not a sampling field (known: {_KNOWN})"
        problems.append(f"{_path_of(err['loc'], where)}: {msg}")
    return BadLine(problems)


def parse_form(
    raw: bytes, line: int, pos: int, vocab: int | None = None, turns: str = "last"
) -> tuple[InputRecord, str]:
    """One non-blank input line as a normalised record and the form it came in (one of
    FORMS), or `BadLine` saying what is wrong. `turns` is the job's setting: with "all" a
    conversation row keeps its assistant turns, which the worker generates again.

    The one parser of validation, reading and `fleet validate`, so they can never disagree.
    """
    return parse_object(_decode(raw, line), line, pos, vocab, turns)


def parse_object(
    obj: dict[str, Any], line: int, pos: int, vocab: int | None = None, turns: str = "last"
) -> tuple[InputRecord, str]:
    """One record's fields (a decoded line, a Parquet row) as `parse_form` returns them: every
    input format checks its records here (fleet/producer/formats/)."""
    data, where = _shape(obj, line, pos, vocab, turns)
    try:
        # strict: a JSONL author who writes "0.7" for a temperature has made a mistake.
        record = InputRecord.model_validate(data, strict=True)
    except ValidationError as e:
        raise _explain(e, where) from None
    given = next(where[k] for k in ("messages", "prompt", "input_ids") if k in where)
    return record, FORMS.get(given, given)


def parse_line(raw: bytes, line: int, pos: int, vocab: int | None = None) -> InputRecord:
    """One non-blank input line as a normalised record, or `BadLine` saying what is wrong."""
    return parse_form(raw, line, pos, vocab)[0]


def _objects(path: Path) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
    """(line number, the line's decoded object or its problem) for every non-blank line, streaming."""
    with path.open("rb") as f:
        head = f.peek(8)
        kind = next((what for magic, what in NOT_TEXT.items() if head.startswith(magic)), None)
        if kind is not None:
            raise InputUnusable(f"{path}: {kind}; fleet reads JSONL text")
        for line, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield line, _decode(raw, line)
            except BadLine as bad:
                yield line, bad
