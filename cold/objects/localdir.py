"""LocalDirStore: the embedded object store, one file per object under a root.

This is the default cold tier when no bucket is configured, so it must give
the same guarantees the service relies on from S3: a put is atomic (readers
see the whole object or nothing), a conditional create never overwrites, and
an acknowledged put survives a crash. We get that from the classic recipe:
write a private temp file, fsync it, then publish it with `os.link` (fails if
the name exists, so it is an atomic create-if-absent) or `os.replace` (atomic
overwrite), and fsync the directory so the new name itself is durable.
Compare-and-set (`put(..., if_match=etag)`) checks the ETag and replaces
under an exclusive `flock` on the staging directory, which every replace and
delete also takes, so no other writer (thread or process) can slip in between
the check and the replace.

All blocking I/O runs in worker threads (`asyncio.to_thread`) so the event
loop never stalls on the disk.

Differences from S3 worth knowing: a key cannot be both an object and a
"directory" of other keys (`a` and `a/b`), because the filesystem forbids it
(the put raises ObjectStoreError); the top-level segment `.staging` is
reserved for in-flight uploads; each key segment is limited to 255 bytes.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from tiered.cold.objects.store import (
    DeleteFailure,
    InvalidKey,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    PreconditionFailed,
    StoredObject,
    check_range,
    validate_key,
    validate_prefix,
)

__all__ = ["LocalDirStore"]

STAGING_DIR = ".staging"
_NAME_MAX = 255
# Temp files older than this at startup belong to a crashed writer.
_STALE_STAGING_SECONDS = 3600.0
# Bound a single pread so huge ranges do not need one giant syscall.
_READ_CHUNK = 64 * 1024 * 1024
# A concurrent delete may prune a parent directory between mkdir and link.
_PUBLISH_ATTEMPTS = 5


class LocalDirStore:
    """ObjectStore over a directory tree. Construct with the root directory."""

    def __init__(self, root: Path | str, *, read_only: bool = False) -> None:
        self._root = Path(root).absolute()
        self._staging = self._root / STAGING_DIR
        self._read_only = read_only
        self._closed = False
        if not read_only:  # read-only (verify, dry runs) creates and sweeps nothing
            self._staging.mkdir(parents=True, exist_ok=True)
            self._sweep_staging()

    @property
    def root(self) -> Path:
        return self._root

    async def __aenter__(self) -> LocalDirStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- public API -------------------------------------------------------

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None
    ) -> ObjectInfo:
        path = self._path(key)
        self._check_writable()
        expected = None if if_match is None else if_match.strip('"')
        if expected is not None and not expected:
            raise ValueError("if_match must be a non-empty ETag")
        return await asyncio.to_thread(self._put_sync, key, path, bytes(data), if_none_match, expected)

    async def put_stream(self, key: str, chunks: AsyncIterator[bytes], size: int) -> ObjectInfo:
        """Create ``key`` from ``chunks`` (a large body, ``payload``): staged, fsynced, published create-only.

        Written a few MiB at a time on a worker thread, so memory stays bounded;
        a failure or cancellation leaves no object (the staged file goes, and a
        process killed meanwhile leaves only a staged file the next open sweeps).
        """
        path = self._path(key)
        self._check_writable()
        tmp = self._staging / f"{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                pending: list[bytes] = []
                held = 0
                async for chunk in chunks:
                    pending.append(chunk)
                    held += len(chunk)
                    if held >= _STREAM_WRITE_BYTES:
                        await asyncio.to_thread(_write_parts, fd, pending)
                        pending, held = [], 0
                await asyncio.to_thread(_write_parts, fd, pending)
                await asyncio.to_thread(os.fsync, fd)
                st = os.fstat(fd)
            finally:
                os.close(fd)
            await asyncio.to_thread(self._publish, key, tmp, path, create=True)
        finally:
            _unlink_quietly(tmp)
        return _info(key, st)

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        path = self._path(key)
        lo, hi = check_range(start, end)
        return await asyncio.to_thread(self._get_sync, key, path, lo, hi)

    async def get_with_info(self, key: str) -> StoredObject:
        path = self._path(key)
        return await asyncio.to_thread(self._get_with_info_sync, key, path)

    async def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        return await asyncio.to_thread(self._head_sync, key, path)

    async def delete(self, key: str) -> None:
        path = self._path(key)
        self._check_writable()
        await asyncio.to_thread(self._delete_sync, path)

    async def delete_many(self, keys: Iterable[str]) -> list[DeleteFailure]:
        # Validate everything first so a bad key deletes nothing.
        paths = [(key, self._path(key)) for key in keys]
        self._check_writable()
        return await asyncio.to_thread(self._delete_many_sync, paths)

    async def close(self) -> None:
        self._closed = True

    # -- key mapping ------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ObjectStoreError("LocalDirStore is closed")

    def _check_writable(self) -> None:
        if self._read_only:
            raise ObjectStoreError("LocalDirStore was opened read-only")

    def _path(self, key: str) -> Path:
        self._check_open()
        validate_key(key)
        segments = key.split("/")
        if segments[0] == STAGING_DIR:
            raise InvalidKey(f"top-level segment {STAGING_DIR!r} is reserved: {key!r}")
        for segment in segments:
            if len(segment.encode("utf-8")) > _NAME_MAX:
                raise InvalidKey(f"key segment longer than {_NAME_MAX} bytes: {key!r}")
        return self._root.joinpath(*segments)

    # -- blocking implementations (run in threads) ------------------------

    @contextmanager
    def _writers_lock(self) -> Iterator[None]:
        """Exclusive among every replace, compare-and-set and delete of this store (threads and processes).

        Creates need no lock: `os.link` refuses an existing name atomically.
        """
        fd = os.open(self._staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _put_sync(
        self, key: str, path: Path, data: bytes, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        tmp = self._staging / f"{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
                # Same inode as the published file, so this is the object's stat.
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if if_match is not None:
                self._compare_and_replace(key, tmp, path, if_match)
            elif if_none_match:
                self._publish(key, tmp, path, create=True)
            else:
                with self._writers_lock():
                    self._publish(key, tmp, path, create=False)
        finally:
            # After os.link the temp name is a second link; after os.replace it is gone.
            _unlink_quietly(tmp)
        return _info(key, st)

    def _compare_and_replace(self, key: str, tmp: Path, path: Path, expected: str) -> None:
        with self._writers_lock():
            current = self._head_sync(key, path)
            if current is None:
                raise PreconditionFailed(key, "no object at the key")
            if current.etag != expected:
                raise PreconditionFailed(key, f"the current ETag is not {expected}")
            os.replace(tmp, path)
            _fsync_dir(path.parent)

    def _publish(self, key: str, tmp: Path, path: Path, *, create: bool) -> None:
        for _ in range(_PUBLISH_ATTEMPTS):
            try:
                self._make_parents(key, path)
                if create:
                    os.link(tmp, path)
                else:
                    os.replace(tmp, path)
            except FileNotFoundError:
                continue  # parent pruned by a concurrent delete: recreate it
            except FileExistsError:
                if path.is_dir():
                    raise _prefix_conflict(key) from None
                raise ObjectExists(key) from None
            except (NotADirectoryError, IsADirectoryError):
                raise _prefix_conflict(key) from None
            _fsync_dir(path.parent)
            return
        raise ObjectStoreError(f"could not publish {key!r}: its directory kept disappearing")

    def _make_parents(self, key: str, path: Path) -> None:
        """Create missing parent directories, fsyncing each new entry's parent."""
        missing: list[Path] = []
        directory = path.parent
        while directory != self._root and not directory.exists():
            missing.append(directory)
            directory = directory.parent
        if directory != self._root and not directory.is_dir():
            raise _prefix_conflict(key)
        for directory in reversed(missing):
            try:
                os.mkdir(directory)
            except FileExistsError:
                if not directory.is_dir():
                    raise _prefix_conflict(key) from None
            except NotADirectoryError:
                raise _prefix_conflict(key) from None
            _fsync_dir(directory.parent)

    def _get_sync(self, key: str, path: Path, start: int, end: int | None) -> bytes:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(key) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # e.g. a "directory" key
                raise ObjectNotFound(key)
            size = st.st_size
            stop = size if end is None else min(end, size)
            if start >= stop:
                return b""
            chunks: list[bytes] = []
            pos = start
            while pos < stop:
                chunk = os.pread(fd, min(stop - pos, _READ_CHUNK), pos)
                if not chunk:  # objects are immutable, but never spin on EOF
                    break
                chunks.append(chunk)
                pos += len(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            os.close(fd)

    def _get_with_info_sync(self, key: str, path: Path) -> StoredObject:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(key) from None
        try:
            # The open file is this version even if the key is replaced meanwhile.
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ObjectNotFound(key)
            chunks: list[bytes] = []
            pos = 0
            while pos < st.st_size:
                chunk = os.pread(fd, min(st.st_size - pos, _READ_CHUNK), pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos += len(chunk)
            return StoredObject(_info(key, st), b"".join(chunks))
        finally:
            os.close(fd)

    def _head_sync(self, key: str, path: Path) -> ObjectInfo | None:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return _info(key, st)

    def _delete_sync(self, path: Path) -> None:
        with self._writers_lock():
            self._delete_locked(path)

    def _delete_locked(self, path: Path) -> None:
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except PermissionError:
            if path.is_dir():  # macOS reports unlink(dir) as EPERM
                return
            raise
        _fsync_dir(path.parent)
        self._prune_empty_dirs(path.parent)

    def _delete_many_sync(self, paths: list[tuple[str, Path]]) -> list[DeleteFailure]:
        failures: list[DeleteFailure] = []
        with self._writers_lock():
            for key, path in paths:
                try:
                    self._delete_locked(path)
                except OSError as exc:
                    code = errno.errorcode.get(exc.errno or 0, "OSError")
                    failures.append(DeleteFailure(key, code, exc.strerror or str(exc)))
        return failures

    def _prune_empty_dirs(self, directory: Path) -> None:
        """Remove now-empty parents so deleted prefixes do not slow listings."""
        while directory != self._root:
            try:
                os.rmdir(directory)
            except OSError:
                return  # not empty (or already gone): stop climbing
            directory = directory.parent

    def _list_sync(self, prefix: str) -> list[ObjectInfo]:
        dir_part, _, name_prefix = prefix.rpartition("/")
        base = self._root.joinpath(*dir_part.split("/")) if dir_part else self._root
        found: list[ObjectInfo] = []
        try:
            top = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return found
        key_base = f"{dir_part}/" if dir_part else ""
        for entry in top:
            if not entry.name.startswith(name_prefix):
                continue
            if not dir_part and entry.name == STAGING_DIR:
                continue
            self._collect(entry, key_base + entry.name, found)
        found.sort(key=lambda info: info.key)
        return found

    def _collect(self, entry: os.DirEntry[str], key: str, found: list[ObjectInfo]) -> None:
        try:
            if entry.is_dir(follow_symlinks=False):
                for child in os.scandir(entry.path):
                    self._collect(child, f"{key}/{child.name}", found)
            elif entry.is_file(follow_symlinks=False):
                validate_key(key)
                found.append(_info(key, entry.stat(follow_symlinks=False)))
        except (FileNotFoundError, NotADirectoryError):
            pass  # deleted while we walked
        except InvalidKey:
            pass  # a stray file no key can name (e.g. undecodable bytes)

    def _sweep_staging(self) -> None:
        cutoff = time.time() - _STALE_STAGING_SECONDS
        for entry in os.scandir(self._staging):
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass

    # Last in the class so the method name does not shadow the builtin in annotations.
    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Yield objects under `prefix` in key order (the directory is walked
        in a thread, then results are yielded from memory)."""
        self._check_open()
        validate_prefix(prefix)
        infos = await asyncio.to_thread(self._list_sync, prefix)
        for info in infos:
            yield info


#: How much of a streamed body is gathered before one write on a worker thread.
_STREAM_WRITE_BYTES = 4 * 1024 * 1024


def _write_parts(fd: int, parts: list[bytes]) -> None:
    for part in parts:
        _write_all(fd, part)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    # Inode + mtime + size changes whenever a key is re-published.
    etag = f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"
    modified = datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=UTC)
    return ObjectInfo(key=key, size=st.st_size, etag=etag, last_modified=modified)


def _prefix_conflict(key: str) -> ObjectStoreError:
    return ObjectStoreError(
        f"key {key!r} conflicts with an existing object or prefix (LocalDirStore cannot hold "
        "both 'a' and 'a/b')"
    )
