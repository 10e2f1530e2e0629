"""Errors that paragraph raises for bad input (models, files, options), and how a command
line reports any exception: as one line and an exit status (`exit_status`)."""

from __future__ import annotations

import sys
import traceback
import warnings
from collections.abc import Callable


class ParagraphError(Exception):
    """Base class of every error paragraph raises on purpose."""


class UnsupportedModelError(ParagraphError):
    """The model uses something paragraph cannot represent (dynamic shapes, control flow, ...).

    The message names the offending variable, operator or construct.
    """


class InputError(ParagraphError):
    """Wrong number, shape, dtype or values of a model's inputs (raised before anything runs)."""


class ModelLoadError(ParagraphError):
    """A model source could not be read (missing or corrupt file, unknown format)."""


class ModelTooLargeError(ParagraphError):
    """The model needs more memory than the machine or device has (checked before allocating).

    The message gives the bytes needed and the bytes there are.
    """


class GraphError(ParagraphError):
    """A paragraph.Graph is malformed (cycle, dangling reference, inconsistent types)."""


class RuleLibraryError(ParagraphError):
    """A rule library file is missing, corrupt, hand-edited or holds an unverified rule.

    The message names the file, the rule and what is wrong.
    """


class FileWriteError(ParagraphError, OSError):
    """A file could not be written (permission, read-only file system, disk full).

    Also an `OSError` (with ``errno``, ``strerror`` and ``filename``), so code that handles
    failed I/O handles it; its message is one line: ``cannot write PATH: REASON``.
    """

    def __init__(self, path: str, cause: OSError) -> None:
        reason = cause.strerror or str(cause) or type(cause).__name__
        super().__init__(cause.errno, f"cannot write {path}: {reason}", path)

    def __str__(self) -> str:
        return str(self.strerror)


class CacheError(ParagraphError):
    """A cache (the cost database) stayed unusable past its retries: locked by another
    process, or a disk that fails to read. The message names the file and what to do."""


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` on Python 3.10 too (which has no add_note, but keeps the
    attribute): `describe` reads a note ``while ...`` as where the error happened."""
    exc.__dict__["__notes__"] = [*getattr(exc, "__notes__", ()), note]


def describe(exc: BaseException) -> str:
    """One line naming what went wrong, for the command line's ``paragraph: error: ...``.

    paragraph's own errors say it themselves; a failed file operation names the file and the
    system's reason; running out of memory says so; an error raised inside TVM is named as
    TVM's, and anything else as an internal error with its type, the first line of its
    message and a pointer to ``--debug`` (which prints the whole traceback).
    """
    # a note "while importing x" (the command line's steps add them) says where it happened
    where = next((f" {n}" for n in getattr(exc, "__notes__", ()) if n.startswith("while ")),
                 "")
    if isinstance(exc, ParagraphError):
        return (_one_line(str(exc)) or type(exc).__name__) + where
    if isinstance(exc, MemoryError):
        return "out of memory" + where + (f" ({_one_line(str(exc))})" if str(exc) else "")
    if isinstance(exc, OSError):
        reason = exc.strerror or _one_line(str(exc)) or type(exc).__name__
        if exc.filename is not None and exc.filename2 is not None:
            return f"cannot access {exc.filename} or {exc.filename2}{where}: {reason}"
        if exc.filename is not None:
            return f"cannot access {exc.filename}{where}: {reason}"
        return f"system error ({type(exc).__name__}){where}: {reason}"
    message = _one_line(str(exc))
    kind = "TVM failed" if _raised_in_tvm(exc) else "internal error"
    return (f"{kind}{where} ({type(exc).__name__}){': ' + message if message else ''} "
            "(rerun with --debug for the traceback)")


def exit_status(command: Callable[[], int], *, debug: bool = False,
                prog: str = "paragraph") -> int:
    """Run a command-line entry point's ``command`` and return its exit status: what it
    returns; 2 after any exception, reported as one line ``PROG: error: ...`` on stderr
    (`describe`); 130 after Ctrl+C (``PROG: interrupted``). With ``debug`` the full traceback
    is printed above that line. Warnings are one line each too (``PROG: warning: ...``).
    ``SystemExit`` (argparse's usage errors) passes through."""

    def one_line(message: Warning | str, category: type[Warning], *args: object,
                 **kwargs: object) -> None:
        print(f"{prog}: warning: {message}", file=sys.stderr, flush=True)

    try:
        with warnings.catch_warnings():
            if not debug:  # --debug keeps Python's form, which says where the warning came from
                warnings.showwarning = one_line
            return command()
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"\n{prog}: interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:  # every kind: the user sees one line, --debug the traceback
        if debug:
            traceback.print_exc()
        if is_interrupt(exc):
            print(f"\n{prog}: interrupted", file=sys.stderr, flush=True)
            return 130
        print(f"\n{prog}: error: {describe(exc)}", file=sys.stderr, flush=True)
        return 2


def is_interrupt(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a Ctrl+C: a ``KeyboardInterrupt``, or the empty ``RuntimeError``
    TVM's FFI turns one into when it lands while TVM's C++ runs (a build, a kernel called
    from paragraph's own code, so no frame of TVM's shows), itself or as the cause of the
    error that reports it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, KeyboardInterrupt):
            return True
        if type(exc) is RuntimeError and not str(exc):  # nothing else raises one bare
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def reraise_interrupt(exc: BaseException) -> None:
    """Raise ``KeyboardInterrupt`` if ``exc`` is a Ctrl+C (`is_interrupt`): for handlers
    that go on after a failure (an estimate for a kernel that did not build, a rewrite left
    out), which would otherwise swallow the user's Ctrl+C that TVM disguised."""
    if is_interrupt(exc):
        raise KeyboardInterrupt from exc


def _one_line(text: str) -> str:
    """The first non-empty line of ``text`` (TVM appends its C++ traceback below it), or the
    last where the text is a traceback itself (a worker process's, passed on)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


def _raised_in_tvm(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is TVM's: in its Python packages, or
    one of the C++ frames TVM's FFI appends (it turns C++ errors into Python's built-in
    types, so the type does not tell)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
    return "/tvm/" in path or "/tvm_ffi/" in path or path.endswith((".cc", ".cpp", ".h"))
