"""Finding the files of a source: one `.txt`, `.jsonl` or `.parquet` file, or a folder of them.

    folder/{b.jsonl, a.txt, sub/c.parquet, .DS_Store, ext -> ../other (holds d.txt)}
      → a.txt, b.jsonl, ext/d.txt, sub/c.parquet     (sorted relative posix names; hidden entries ignored)

Folders are walked in sorted order following symbolic links (also out of the folder), every folder read at
most once by its resolved path; dangling or looping links, links to a folder already read and special files
are named (`discover_files`). A missing source, an empty folder or an unsupported file type raises
`InputDataError` naming the path and what is allowed. Reading the files found is packtrain.data.source_readers.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packtrain.errors import InputDataError

Kind = Literal["txt", "jsonl", "parquet"]
SUPPORTED: dict[str, Kind] = {".txt": "txt", ".jsonl": "jsonl", ".parquet": "parquet"}
ALLOWED = ", ".join(SUPPORTED)


@dataclass(frozen=True)
class SourceFile:
    """One input file. `name` is what the `source` column shows (path relative to the source folder)."""

    path: Path
    name: str
    kind: Kind
    n_bytes: int


@dataclass(frozen=True)
class SkippedEntry:
    """An entry of a source folder that cannot be read: a dangling or looping symbolic link, a link to a
    folder already read, a special file (FIFO, socket, device). `target` is what a link points to
    (`os.readlink`), None for other entries."""

    name: str
    problem: str
    target: str | None = None

    def describe(self) -> str:
        """'notes/a.txt -> ../gone.txt (dangling: the target does not exist)'"""
        arrow = f" -> {self.target}" if self.target is not None else ""
        return f"{self.name}{arrow} ({self.problem})"

    def to_dict(self) -> dict:
        return {"name": self.name, "target": self.target, "problem": self.problem}


@dataclass
class Discovery:
    files: list[SourceFile]
    skipped: list[str]  # unsupported files skipped (ingest.unsupported=skip), relative names
    bad_entries: list[SkippedEntry] = field(default_factory=list)   # skipped (ingest.unsupported=skip)
    linked_folders: list[dict] = field(default_factory=list)         # [{"name", "target"}] read through a link
    linked_files: int = 0                                            # files read through a link to a file

    @property
    def exact(self) -> bool:
        """True when the files read are exactly the folder's plain files (nothing skipped, no link followed)."""
        return not (self.skipped or self.bad_entries or self.linked_folders or self.linked_files)


def discover_files(source: Path, unsupported: Literal["error", "skip"] = "error") -> Discovery:
    """The files of a source in deterministic order (sorted relative posix paths; hidden entries ignored).

    >>> # folder/{b.jsonl, a.txt, sub/c.parquet, .DS_Store} → [a.txt, b.jsonl, sub/c.parquet]

    Symbolic links are followed, also when they point outside the folder: a link to a file is read under the
    link's name, a link to a folder is walked under the link's name. Every folder is read at most once (by
    its resolved path), which is the loop detection: a link to a folder that is already read (the folder
    holding the link or one above it — a loop — or one reached another way) is not followed. Such links,
    dangling links, link chains that loop, special files (FIFO, socket, device) and unsupported file types are
    an InputDataError naming each entry (and a link's target), or, with `unsupported="skip"`, skipped and
    returned in `skipped` / `bad_entries` for the caller to report.
    """
    if not source.exists():
        if source.is_symlink():
            raise InputDataError(f"source {source} is a symbolic link to {os.readlink(source)} "
                                 f"({_link_problem(source)}); point --source at an existing file or folder")
        raise InputDataError(f"source {source} does not exist (expected a {ALLOWED} file or a folder of them)")
    if source.is_file():
        problem = name_problem(source.name, source.parent)
        if problem is not None:
            raise InputDataError(f"source {shown_path(source)}: {problem}; {RENAME}")
        kind = SUPPORTED.get(source.suffix.lower())
        if kind is None:
            raise InputDataError(
                f"source {source}: unsupported file type {source.suffix or '(no suffix)'!r} (allowed: {ALLOWED})")
        return Discovery([SourceFile(source, source.name, kind, source.stat().st_size)], [])
    if not source.is_dir():
        raise InputDataError(f"source {source} is not a regular file or folder (expected a {ALLOWED} file or a "
                             "folder of them)")
    disc = _walk(source, unsupported)
    files, bad, entries = disc.files, disc.skipped, disc.bad_entries
    if not files and not bad and not entries:
        raise InputDataError(f"source folder {source} is empty: no {ALLOWED} files found (hidden files are ignored)")
    if (bad or entries) and unsupported == "error":
        parts = []
        if bad:
            parts.append(f"{len(bad)} file(s) of unsupported type: {_shown(bad)} (allowed: {ALLOWED})")
        if entries:
            parts.append(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} that cannot be read: "
                         + _shown([e.describe() for e in entries]))
        raise InputDataError(
            f"source folder {source}: " + "; ".join(parts) + "; remove them or pass --set ingest.unsupported=skip "
            "to ingest the supported files and skip these")
    if not files:
        raise InputDataError(
            f"source folder {source} has no {ALLOWED} files; {len(bad) + len(entries)} entries skipped: "
            + _shown(bad + [e.describe() for e in entries]))
    return disc


def _shown(items: list[str], n: int = 10) -> str:
    return ", ".join(items[:n]) + (f", ... ({len(items) - n} more)" if len(items) > n else "")


def _link_problem(path: Path) -> str | None:
    """Why the link `path` cannot be followed ('dangling: the target does not exist', 'a symbolic link loop',
    ...), or None when it resolves."""
    try:
        path.resolve(strict=True)
    except FileNotFoundError:
        return "dangling: the target does not exist"
    except RuntimeError:   # Python < 3.13: "Symlink loop from ..."
        return "a symbolic link loop"
    except OSError as e:
        return "a symbolic link loop" if e.errno == errno.ELOOP else f"cannot be followed: {e.strerror}"
    return None


RENAME = "rename it to valid UTF-8 (e.g. `convmv -f latin1 -t utf-8 --notest NAME`) or remove it"


def shown_path(path: str | Path) -> str:
    """A path as text that is always valid UTF-8: undecodable bytes of a file name (which Python keeps as
    lone surrogates, PEP 383) shown as `\\xe9`.

    >>> shown_path(os.fsdecode(b"in/caf\\xe9.txt"))
    'in/caf\\\\xe9.txt'
    """
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def name_problem(name: str, folder: str | Path) -> str | None:
    """Why the file name `name` (as os.scandir gives it) in `folder` cannot be ingested, or None: a name that
    is not valid UTF-8 cannot be written to the documents table's `source` column (nor shown without bytes).

    >>> name_problem(os.fsdecode(b"caf\\xe9.txt"), "in")
    "file name b'caf\\\\xe9.txt' in folder 'in' is not valid UTF-8 (byte 0xe9 at offset 3)"
    """
    raw = os.fsencode(name)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return (f"file name {raw!r} in folder {shown_path(folder)!r} is not valid UTF-8 (byte 0x{raw[e.start]:02x} "
                f"at offset {e.start})")
    return None


def _walk(source: Path, unsupported: Literal["error", "skip"] = "error") -> Discovery:
    """Depth-first over sorted entries, following links, each real folder once (see discover_files)."""
    walker = _Walker(source, unsupported)
    walker.claim(str(source.resolve()), "")
    walker.visit(str(source), "")
    disc = walker.disc
    disc.files.sort(key=lambda f: f.name)
    disc.skipped.sort()
    return disc


class _Walker:
    """One walk of a source folder: what it found so far (`disc`) and every real folder it has read or is about
    to read (`read_as`: real path → its name in the source), so a link into one is not followed twice."""

    def __init__(self, source: Path, unsupported: Literal["error", "skip"]) -> None:
        self.source = source
        self.unsupported = unsupported
        self.disc = Discovery([], [])
        self.read_as: dict[str, str] = {}

    def claim(self, real: str, name: str) -> None:
        """Mark `real` and its plain (non-link, non-hidden) subfolders as read under `name`."""
        for dirpath, dirnames, _ in os.walk(real, onerror=_raise_unreadable(self.source, name)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, real)
            self.read_as[dirpath] = name if rel == "." else (f"{name}/{rel}" if name else rel)

    def visit(self, folder: str, prefix: str) -> None:
        """Read `folder` (a path as reached from the source, through links) whose entries are named prefix+…"""
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise InputDataError(f"source folder {self.source}: cannot read folder {prefix or '.'} ({e.strerror}); "
                                 "make it readable or remove it") from None
        for entry in entries:
            if entry.name.startswith("."):
                continue
            name = prefix + entry.name
            problem = name_problem(entry.name, folder)
            if problem is not None:   # refused before anything reads it, or skipped and named (bytes escaped)
                if self.unsupported == "error":
                    raise InputDataError(f"source folder {shown_path(self.source)}: {problem}; {RENAME}")
                self.disc.bad_entries.append(SkippedEntry(shown_path(name), problem))
                continue
            if entry.is_symlink():
                self.visit_link(entry, name)
            elif entry.is_dir(follow_symlinks=False):
                self.visit(entry.path, name + "/")
            elif entry.is_file(follow_symlinks=False):
                self.add_file(Path(entry.path), name, entry.stat(follow_symlinks=False).st_size)
            else:
                self.disc.bad_entries.append(SkippedEntry(name, "not a regular file: a FIFO, socket or device"))

    def visit_link(self, entry: os.DirEntry, name: str) -> None:
        """A link: its folder read once (a loop or a folder read already is skipped and named), its file added."""
        target = os.readlink(entry.path)
        path = Path(entry.path)
        problem = _link_problem(path)
        if problem is not None:
            self.disc.bad_entries.append(SkippedEntry(name, problem, target))
            return
        real = str(path.resolve())
        if os.path.isdir(real):
            problem = self.read_already(path, real)
            if problem is not None:
                self.disc.bad_entries.append(SkippedEntry(name, problem + "; not followed", target))
                return
            self.claim(real, name)
            self.disc.linked_folders.append({"name": name, "target": real})
            self.visit(entry.path, name + "/")
        elif os.path.isfile(real):
            self.disc.linked_files += 1
            self.add_file(path, name, os.stat(real).st_size)
        else:
            self.disc.bad_entries.append(SkippedEntry(name, "links to something that is not a regular file or folder",
                                                      target))

    def read_already(self, link: Path, real: str) -> str | None:
        """Why the folder link `link` (to `real`) is not followed — a loop, or its folder or one inside it is read
        already — or None."""
        inside = next((r for r in self.read_as if r == real or r.startswith(real + os.sep)), None)
        if inside is None:
            return None
        place = f"folder {self.read_as[inside]!r}" if self.read_as[inside] else "the source folder"
        holder = str(link.parent.resolve())
        if holder == real or holder.startswith(real + os.sep):
            return f"a loop: links back to {place}"
        if inside == real:
            return f"links to {place}, which is read already"
        return f"links to a folder that contains {place}, which is read already"

    def add_file(self, path: Path, name: str, size: int) -> None:
        kind = SUPPORTED.get(path.suffix.lower())
        if kind is None:
            self.disc.skipped.append(name)
        else:
            self.disc.files.append(SourceFile(path, name, kind, size))


def _raise_unreadable(source: Path, name: str):
    def onerror(e: OSError) -> None:
        raise InputDataError(f"source folder {source}: cannot read folder {e.filename} ({e.strerror}); make it "
                             "readable or remove it") from None
    return onerror
