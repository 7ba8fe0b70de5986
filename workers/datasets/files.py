"""Bytes on disk: gzip or plain JSON in, atomic gzip or plain JSON out."""

from __future__ import annotations

import errno
import gzip
import io
import json
import math
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any

from pipetune.workers.datasets.records import DatasetError

GZIP_MAGIC = b"\x1f\x8b"


# The most text a dataset file may hold, gunzipped: the largest recorded space here (17,956
# configurations, a Kernel Tuner cache) is 16.6 MB of text; a file past this is not a
# dataset but a gzip bomb or a device (/dev/zero), either read until memory ran out. It is
# also what loads in sensible time and memory: a synthetic Kernel Tuner cache of a million
# configurations (benchmarks/bench_large_spaces.py) is 464 MB of text, and `bench tuner` on
# it takes about 43 s of CPU and 2.5 GB (benchmarks/RESULTS.md, kt-cache-loading); one of
# ten million (4.6 GB) would need ten times that.
MAX_TEXT_BYTES = 512 * 2**20
# What is inflated or read at a time: the refusal of a file past the limit holds no more
# than the limit's worth of text (a single read of it held that twice over).
CHUNK_BYTES = 16 * 2**20


def read_text(path: str | Path) -> str:
    """The file's text, gunzipped when it is gzip (by content, not by name); DatasetError
    past MAX_TEXT_BYTES, read or gunzipped (only that much is ever read)."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            # Read, not peeked: a pipe may hand over its first byte alone, and a peek of it
            # took a gzip stream for text. Put back in front of the rest for the reading.
            head = file.read(len(GZIP_MAGIC))
            size = os.fstat(file.fileno()).st_size
            stream = _Rejoined(head, file)
            if head == GZIP_MAGIC:
                raw = _gunzipped(path, stream, size)
            else:
                raw = _bounded_read(path, stream, gzipped=False)
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


class _Rejoined:
    """A stream's first bytes, read already, put back in front of the rest (a pipe cannot
    be sought back to them)."""

    def __init__(self, head: bytes, rest: io.BufferedReader) -> None:
        self.head = head
        self.rest = rest

    def read(self, size: int = -1) -> bytes:
        if not self.head:
            return self.rest.read(size)
        if size < 0:
            data, self.head = self.head + self.rest.read(), b""
            return data
        data, self.head = self.head[:size], self.head[size:]
        return data + self.rest.read(size - len(data)) if len(data) < size else data


def _gunzipped(path: Path, file: _Rejoined, size_on_disk: int) -> bytearray:
    # (Its text is longer but for padding or empty members, which no dataset writer makes;
    # a file past the limit on disk was refused uninflated by the earlier reading as well.)
    if size_on_disk > MAX_TEXT_BYTES:
        raise DatasetError(_too_large(path, gzipped=True))
    try:
        with gzip.GzipFile(fileobj=file) as stream:
            return _bounded_read(path, stream, gzipped=True)
    except EOFError:
        raise DatasetError(f"{path}: truncated gzip stream") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise DatasetError(f"{path}: corrupt gzip data ({exc})") from None
    except OSError as exc:
        if exc.errno is not None:  # the file itself could not be read (not its content)
            raise
        raise DatasetError(f"{path}: corrupt gzip data ({exc})") from None


def _bounded_read(path: Path, stream: Any, *, gzipped: bool) -> bytearray:
    """The stream's bytes, read CHUNK_BYTES at a time; DatasetError as soon as they pass
    MAX_TEXT_BYTES (what was read is let go of: the refusal costs no more than that)."""
    data = bytearray()
    while chunk := stream.read(min(CHUNK_BYTES, MAX_TEXT_BYTES + 1 - len(data))):
        data += chunk
        if len(data) > MAX_TEXT_BYTES:
            del data
            raise DatasetError(_too_large(path, gzipped))
    return data  # (not copied to bytes: it is decoded at once, and is let go of then)


def _size_text(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB" if size >= 2**20 else f"{size / 2**10:,.1f} KiB"


def _too_large(path: Path, gzipped: bool) -> str:
    """The refusal of a file past MAX_TEXT_BYTES: its size on disk and the limit."""
    limit = f"{MAX_TEXT_BYTES // 2**20} MiB"
    try:
        size = f"{_size_text(path.stat().st_size)} on disk" + (", gzip'd" if gzipped else "")
    except OSError:
        size = "size unknown"
    if not path.is_file():
        size = "not a regular file"
    return (
        f"{path}: more than {limit} of text: not a dataset file ({size}; a dataset file "
        f"holds at most {limit} of text{' gunzipped' if gzipped else ''}, about a million "
        "Kernel Tuner cache entries: more is refused before it is parsed, which would "
        "take more memory than a machine has)"
    )


# Dataset files nest a few levels (T4: document, results, result, times, runtimes); deeper
# nesting is corruption, and refusing it here keeps every later step (recursive copies,
# error messages, writing) far from the interpreter's recursion limit.
MAX_DEPTH = 64


def _reject_constant(name: str) -> Any:
    # JSON has no NaN or Infinity; Python's json would accept them silently.
    raise DatasetError(f"non-standard JSON constant {name}")


def _check_nesting_and_numbers(document: Any) -> None:
    """DatasetError if the document nests deeper than MAX_DEPTH or holds a number beyond
    the float range (1e400 parses as inf, which no JSON file, ours included, can hold)."""
    stack = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if type(value) is float:  # only the document itself: items are checked below
            if math.isinf(value):
                raise DatasetError("a number is beyond the float range")
            continue
        if type(value) is not dict and type(value) is not list:
            continue
        if depth > MAX_DEPTH:
            raise DatasetError(f"JSON nested deeper than {MAX_DEPTH} levels")
        items = value.values() if type(value) is dict else value
        # The types present, and the items compared with infinity, in C: a Python step per
        # item was a second of CPU for a cache of 200,000 entries.
        kinds = set(map(type, items))
        if float in kinds and (math.inf in items or -math.inf in items):
            raise DatasetError("a number is beyond the float range")
        if dict in kinds or list in kinds:
            stack.extend((item, depth + 1) for item in items if type(item) in (dict, list))


def repeated_key(pairs: list[tuple[str, Any]]) -> str | None:
    """The first key a JSON object's pairs (json's object_pairs_hook) give twice, None when
    they are distinct: json keeps the last of a repeated key without a word."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    return None


def _object_without_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are distinct: a cache entry written twice (two measurements of
    one configuration) lost one without a word. (The dict is made first and the pairs
    searched only where it came out shorter: the search cost more than the parse.)"""
    document = dict(pairs)
    if len(document) != len(pairs):
        repeated = repeated_key(pairs)
        assert repeated is not None
        shown = repeated if len(repeated) <= 60 else repeated[:57] + "..."
        raise DatasetError(f"the key {json.dumps(shown)} appears twice in one object")
    return document


def parse_json(text: str, source: str) -> Any:
    try:
        document = json.loads(
            text,
            parse_constant=_reject_constant,
            object_pairs_hook=_object_without_duplicate_keys,
        )
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"{source}: not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})"
        ) from None
    except DatasetError as exc:
        raise DatasetError(f"{source}: {exc}") from None
    except RecursionError:
        # Thousands of nested brackets: json's decoder recurses once per level.
        raise DatasetError(f"{source}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        # The only other ValueError json.loads raises: an integer literal longer than
        # Python converts (sys.get_int_max_str_digits(), 4300 digits by default).
        raise DatasetError(f"{source}: not valid JSON (a number with too many digits)") from None
    try:
        _check_nesting_and_numbers(document)
    except DatasetError as exc:
        raise DatasetError(f"{source}: {exc}") from None
    return document


def dumps(document: Any) -> str:
    # allow_nan=False: a NaN would make a file that strict JSON readers reject.
    return json.dumps(document, allow_nan=False, separators=(",", ":"))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, text: str) -> Path:
    """Write text (gzipped if the name ends in .gz) so that the path never holds a partial
    file: write a temporary file beside it, flush it to disk, then rename it over the path.
    A symbolic link is written through (its target replaced, the link kept), as a plain
    open() would."""
    path = Path(path)
    data = text.encode("utf-8")
    if path.suffix == ".gz":
        # mtime=0: the same dataset gives the same bytes (reproducible, diff-friendly).
        data = gzip.compress(data, mtime=0)
    return write_bytes_atomic(path, data)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Bytes written as write_atomic writes text. The temporary file is mkstemp's (a new
    file of an unpredictable name, O_EXCL): a name known in advance could be a link someone
    left there, and writing through it overwrote the link's target."""
    (target,) = write_all_atomic([(Path(path), data)])
    return target


def write_all_atomic(files: list[tuple[Path, bytes]]) -> list[Path]:
    """Several files written all or none: each is written whole to a temporary file beside
    its path first, and only once every one is on disk are they renamed into place (a
    rename does not run out of space). A write that fails (a full disk) leaves none of them;
    the folders made for them stay. A target a file cannot replace (a folder of that name) is
    refused before any is renamed; a rename that fails all the same (the folder's permissions
    changed in the moment) leaves the files renamed before it, and no temporary file."""
    for path, _ in files:
        if path.is_dir():  # (found at its rename, it left the files renamed before it)
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file, is there", str(path))
    staged = _staged(files)
    renamed = 0
    try:
        for target, tmp in staged:
            os.replace(tmp, target)
            renamed += 1
    except BaseException:
        for _, tmp in staged[renamed:]:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [target for target, _ in staged]


def _staged(files: list[tuple[Path, bytes]]) -> list[tuple[Path, str]]:
    """Each file's bytes in a temporary file beside its path, flushed to disk: (path, the
    temporary file) each; on any failure every temporary file made is removed."""
    staged: list[tuple[Path, str]] = []
    try:
        for path, data in files:
            if path.is_symlink():
                path = path.resolve()
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            staged.append((path, tmp))
            # mkstemp makes the file private (0600); give it the mode a plain open() would.
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
    except BaseException:
        for _, tmp in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    return staged
