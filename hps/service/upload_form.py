"""An import's multipart body, parsed as it arrives: file parts written straight to disk.

starlette's ``request.form()`` spools each file part to a temporary file (``/tmp``, often a
small tmpfs in a container), which an import would then copy into its staging folder:
every upload written twice, and held twice while it waits. :func:`receive` writes each
file part into ``folder/<field name>`` as its bytes arrive (in a worker thread, gathered
into writes of :data:`WRITE_BYTES`: the event loop never waits on the disk) and keeps text
fields in memory (at most :data:`MAX_TEXT_BYTES` each). A url-encoded form (text fields
only, at most :data:`MAX_TEXT_BYTES`) is read too.

A body that is not such a form is a :class:`~hps.errors.FormatError` (422) naming what is
wrong: not ``multipart/form-data`` or no boundary, a malformed part, a field not expected or
given twice, a file where text is expected or the reverse, a body that ends before its
closing boundary. Whatever ends the request early (such an error, the job queue's refusal
of an upload growing past its budget, a client gone) leaves no file behind.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qsl

import anyio.to_thread
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from hps.errors import BackendUnavailable, FormatError

# a malformed body is the client's error, answered with the parser's words: not a log line
# per hostile request
logging.getLogger("python_multipart").setLevel(logging.ERROR)

MAX_TEXT_BYTES = 64 * 1024
CLIENT_TEXT = "hps.client_text"
"""The scope's list of the form's field names and text values, as received: what an error
answer may echo of them is the client's own (:func:`hps.service.app.client_sent`)."""
WRITE_BYTES = 1 << 20  # a file part's bytes gathered before one write


@dataclass(frozen=True)
class Form:
    """The fields of a received form: text values, and the files written for file parts."""

    text: dict[str, str]
    files: dict[str, Path]


@dataclass
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    name: str = ""
    is_file: bool = False
    text: bytearray = field(default_factory=bytearray)


class _Receiver:
    """The parser's callbacks: parts checked as their headers end, file bytes queued for
    :meth:`flush` (the callbacks run inside ``parser.write`` and must not block)."""

    def __init__(self, folder: Path, text_fields: frozenset[str], file_fields: frozenset[str]):
        self.folder = folder
        self.text_fields = text_fields
        self.file_fields = file_fields
        self.part = _Part()
        self.header_name = bytearray()
        self.header_value = bytearray()
        self.text: dict[str, str] = {}
        self.files: dict[str, Path] = {}
        self.open: dict[str, BinaryIO] = {}
        self.queued: list[tuple[str, bytes]] = []
        self.queued_bytes = 0
        self.ended = False
        self.sent: list[str] = []  # field names and text values received (CLIENT_TEXT)

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_end": self.on_end,
        }

    def on_part_begin(self) -> None:
        self.part = _Part()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.part.headers[bytes(self.header_name).lower()] = bytes(self.header_value)
        self.header_name.clear()
        self.header_value.clear()

    def on_headers_finished(self) -> None:
        disposition, options = parse_options_header(self.part.headers.get(b"content-disposition"))
        if disposition != b"form-data" or b"name" not in options:
            raise FormatError("a multipart part lacks `Content-Disposition: form-data; name=...`")
        name = options[b"name"].decode("utf-8", "replace")
        self.sent.append(name)
        expected = self.text_fields | self.file_fields
        if name not in expected:
            raise FormatError(f"unknown form field {name[:64]!r}: expected {sorted(expected)}")
        if name in self.text or name in self.files:
            raise FormatError(f"form field `{name}` is given twice")
        is_file = b"filename" in options
        if is_file and name in self.text_fields:
            raise FormatError(f"form field `{name}` must be text")
        if not is_file and name in self.file_fields:
            raise FormatError(f"form field `{name}` must be a file part")
        self.part.name, self.part.is_file = name, is_file
        if is_file:
            self.files[name] = self.folder / name

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.part.is_file:
            self.queued.append((self.part.name, data[start:end]))
            self.queued_bytes += end - start
            return
        if len(self.part.text) + end - start > MAX_TEXT_BYTES:
            raise FormatError(f"form field `{self.part.name}` is over {MAX_TEXT_BYTES:,} bytes")
        self.part.text += data[start:end]

    def on_part_end(self) -> None:
        if not self.part.is_file:
            try:
                self.text[self.part.name] = self.part.text.decode()
                self.sent.append(self.text[self.part.name])
            except UnicodeDecodeError:
                raise FormatError(f"form field `{self.part.name}` is not UTF-8 text") from None

    def on_end(self) -> None:
        self.ended = True

    def flush(self) -> None:
        """Write the queued file bytes (a worker thread's work)."""
        queued, self.queued, self.queued_bytes = self.queued, [], 0
        for name, data in queued:
            out = self.open.get(name)
            if out is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                out = self.open[name] = open(self.files[name], "xb")  # noqa: SIM115
            out.write(data)

    def close(self) -> None:
        for out in self.open.values():
            out.close()


async def receive(
    request: Request, folder: Path, text_fields: frozenset[str], file_fields: frozenset[str]
) -> Form:
    """Read ``request``'s multipart body: the fields ``text_fields`` (text) and
    ``file_fields`` (files, written to ``folder/<name>``; ``folder``, made when the first
    file part arrives, must not exist yet). Each field at most once, every one optional."""
    content_type, params = parse_options_header(request.headers.get("content-type"))
    if content_type == b"application/x-www-form-urlencoded":
        return Form(await _url_encoded(request, text_fields, file_fields), {})
    if content_type != b"multipart/form-data" or not params.get(b"boundary"):
        raise FormatError(
            "the body must be multipart/form-data with a boundary "
            "(or a url-encoded form of text fields)"
        )
    got = _Receiver(folder, text_fields, file_fields)
    got.sent = request.scope.setdefault(CLIENT_TEXT, [])
    try:
        try:
            parser = MultipartParser(params[b"boundary"], got.callbacks())  # type: ignore[arg-type]
            async for chunk in request.stream():
                parser.write(chunk)
                if got.queued_bytes >= WRITE_BYTES:
                    await anyio.to_thread.run_sync(got.flush)
            parser.finalize()
        except FormParserError as exc:
            raise FormatError(f"invalid multipart body: {exc}") from None
        if not got.ended:
            raise FormatError("the multipart body ends before its closing boundary")
        await anyio.to_thread.run_sync(got.flush)
        for name, path in got.files.items():  # an empty file part: an empty file
            if name not in got.open:
                folder.mkdir(parents=True, exist_ok=True)
                path.touch()
    except OSError as exc:  # a full disk
        got.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise BackendUnavailable(f"the upload could not be staged: {exc.strerror}") from None
    except BaseException:
        got.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    got.close()
    return Form(got.text, got.files)


async def _url_encoded(
    request: Request, text_fields: frozenset[str], file_fields: frozenset[str]
) -> dict[str, str]:
    """The text fields of a url-encoded form (no files: those take multipart)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_TEXT_BYTES:
            raise FormatError(f"a url-encoded form is over {MAX_TEXT_BYTES:,} bytes")
    try:
        pairs = parse_qsl(body.decode("ascii"), keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise FormatError("the url-encoded form is not valid") from None
    text: dict[str, str] = {}
    request.scope.setdefault(CLIENT_TEXT, []).extend(t for pair in pairs for t in pair)
    for name, value in pairs:
        if name in file_fields:
            raise FormatError(f"form field `{name}` must be a file part (multipart/form-data)")
        if name not in text_fields:
            expected = sorted(text_fields | file_fields)
            raise FormatError(f"unknown form field {name[:64]!r}: expected {expected}")
        if name in text:
            raise FormatError(f"form field `{name}` is given twice")
        text[name] = value
    return text
