"""A run directory at a URL (`hydra.run.dir=s3://bucket/runs/a`, `gs://...`, any fsspec URL
whose package is installed): the run writes a local mirror, and the URL is kept in step.

The mirror is `$TRAINER_SCRATCH/trainer-scratch/<hash of the URL>` (the system's temporary
directory where `TRAINER_SCRATCH` is unset). Before the run starts (its lease held:
`trainer.rundir.lease`), the mirror is made an exact copy of what the URL holds (`pull`),
so the rules of a local run directory (refuse a finished run, a changed config, resume from
the newest backup) run on it unchanged. The run's place (`RunPlace`: the mirror, and the
lease) is opened once for the command (`trainer.run.prepare.place`), held by the run's
owner, and closed at the command's end. After every backup (`RunPlace.committed`, called by
`trainer.rundir.backup.BackupStore` once the backup is renamed into place, in the thread
that completes backups beside training) and at the run's end (`RunPlace.close`), the files
that changed are uploaded (`push`):

- each file is one object, PUT whole: an object store's PUT (a multipart upload too) makes
  the object appear complete or not at all, never half written;
- a backup's `state.json` is uploaded after every other file of the push, and `summary.json`
  (a finished run) last of all: a reader that finds a backup's `state.json` finds its
  weights; a `backup/ckpt-*/` without `state.json` is a backup cut short, never downloaded,
  and removed at the next push, as `tidy` removes a local `.tmp-*`;
- files gone from the mirror (an old backup pruned) are removed after the upload, each
  backup's `state.json` first, so the URL holds the newest two whole backups at every point.

A push that fails (the network gone, access revoked) stops the run as a signal does
(`Interrupted`, exit 75): the URL keeps the last backup that reached it, and the same command
resumes from it. The endpoint and credentials are the storage library's own: `AWS_*`
variables (`AWS_ENDPOINT_URL` for an S3-compatible server) for s3fs, Google's application
default credentials and `STORAGE_EMULATOR_HOST` for gcsfs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config.errors import ConfigError, Interrupted
from trainer.rundir.atomic import TMP
from trainer.rundir.layout import LEASE, LOCK, STATE, SUMMARY

log = logging.getLogger(__name__)

SCRATCH = "TRAINER_SCRATCH"
MARKER = STATE  # a backup's: written (and uploaded) after its other files
FINISHED = SUMMARY  # a finished run's: uploaded last
LOCAL_ONLY = "input_cache"  # never uploaded (see `_local_files`)
# The package fsspec needs for each scheme, for the one line where it is missing.
PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
            "abfs": "adlfs", "hf": "huggingface_hub"}
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


KEEP_SCRATCH = "TRAINER_KEEP_SCRATCH"  # 1: a run's local copy is kept after it ends
# Stores that keep nothing once the process ends: a run there would be lost with it.
NOT_KEPT = ("memory",)
# `s3:/bucket` (one slash): a URL the shell or a typo cut, which would be a local folder.
ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/?(?!/)(.*)$")


def is_url(place: Any) -> bool:
    """Whether a run directory is a URL (`file://` and plain paths are local)."""
    text = str(place)
    return bool(URL.match(text)) and not text.startswith("file://")


def _known_scheme(scheme: str) -> bool:
    if scheme.lower() in PACKAGES:
        return True
    try:
        from fsspec.registry import known_implementations
    except ImportError:
        return False
    return scheme.lower() in known_implementations and scheme.lower() != "file"


def check_url(text: str, option: str = "hydra.run.dir") -> None:
    """Refuses a run directory that is a malformed URL, or one at a store that keeps
    nothing: one slash after a known scheme (`s3:/bucket`, a local folder `s3:` otherwise),
    an upper-case scheme (`S3://`), a URL without a place (`s3://`), `memory://`.

    Raises:
        ConfigError: naming the value and what would be valid.
    """
    text = str(text)
    if URL.match(text):
        scheme, _, rest = text.partition("://")
        if scheme != scheme.lower():
            raise ConfigError(f"{option}={text}: a URL's scheme is lower case; write "
                              f"{scheme.lower()}://{rest}")
        if scheme in NOT_KEPT:
            raise ConfigError(f"{option}={text}: {scheme}:// keeps nothing once this process "
                              "ends, so the run would be lost; use a store that keeps it "
                              "(s3://, gs://, ...) or a local directory")
        if not rest.strip("/") and scheme != "file":
            raise ConfigError(f"{option}={text} names no bucket or path; e.g. "
                              f"{scheme}://BUCKET/runs/NAME")
        return
    cut = ONE_SLASH.match(text)
    if cut and _known_scheme(cut.group(1)):
        scheme = cut.group(1).lower()
        raise ConfigError(f"{option}={text} is not a URL (a URL has two slashes after its "
                          f"scheme: {scheme}://{cut.group(2).lstrip('/')}), nor a local "
                          f"directory one would name {cut.group(1)}:")


def scratch_base() -> Path:
    """Where runs at URLs keep their local copies: `$TRAINER_SCRATCH/trainer-scratch` (the
    system's temporary directory where it is unset)."""
    return Path(os.environ.get(SCRATCH) or tempfile.gettempdir()) / "trainer-scratch"


def scratch(url: str, purpose: str = "run") -> Path:
    """The local mirror of `url`: one per URL and purpose (`run`, or `read` for evaluate and
    predict, which never write the run's mirror)."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return scratch_base() / f"{digest}-{purpose}"


def check_scratch() -> None:
    """Refuses a scratch place this process cannot write (before anything is downloaded
    there, where its failure read as a full disk).

    Raises:
        ConfigError: naming the place, why, and `TRAINER_SCRATCH`.
    """
    base = scratch_base()
    try:
        base.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=base).close()
    except OSError as error:
        given = (f"{SCRATCH}={os.environ[SCRATCH]}" if os.environ.get(SCRATCH)
                 else f"the temporary directory {base.parent}")
        raise ConfigError(f"{given} cannot be written ({error.strerror or error}); a run at a "
                          f"URL keeps its local copy there: set {SCRATCH} to a writable "
                          "directory") from None


def keep_scratch() -> bool:
    """Whether a run's local copy is kept after it ends (`TRAINER_KEEP_SCRATCH=1`)."""
    return os.environ.get(KEEP_SCRATCH, "").strip().lower() in ("1", "true", "yes")


# The variables naming a credentials file, by scheme, where a file that is not there is an
# error: gcsfs printed its fallbacks and retries (50 lines) and then blamed the network.
# (botocore takes a missing AWS_SHARED_CREDENTIALS_FILE as no file, and looks elsewhere.)
CREDENTIAL_FILES = {"gs": ("GOOGLE_APPLICATION_CREDENTIALS",),
                    "gcs": ("GOOGLE_APPLICATION_CREDENTIALS",)}


def _check_credential_files(url: str, protocol: str) -> None:
    """Refuses a credentials file the environment names that is not there, before any
    request."""
    for name in CREDENTIAL_FILES.get(protocol, ()):
        path = os.environ.get(name)
        if path and not os.path.isfile(os.path.expanduser(path)):
            raise ConfigError(f"{name}={path} names no file, so {url} cannot be reached with "
                              f"its credentials; point {name} at the key file, or unset it")


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of `url` and the path in it (`bucket/runs/a`).

    Raises:
        ConfigError: no package for the scheme is installed (naming it), or fsspec does not
            know the scheme.
    """
    protocol = url.split("://", 1)[0].lower()
    try:
        import fsspec
    except ImportError:
        raise ConfigError(f"a run directory at a URL ({url}) needs fsspec: pip install "
                          "'trainer[remote]'") from None
    _check_credential_files(url, protocol)
    options: dict[str, Any] = {}
    if protocol in ("gs", "gcs") and os.environ.get("STORAGE_EMULATOR_HOST"):
        # an emulator has no credentials, and no gRPC endpoint to probe a bucket's kind
        # (gcsfs waits 60 s per bucket for it)
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        options["token"] = "anon"
    try:
        kind = fsspec.get_filesystem_class(protocol)
    except ImportError:
        package = PACKAGES.get(protocol, f"the fsspec package for {protocol}://")
        raise ConfigError(f"a run directory at {url} needs {package}: pip install "
                          f"'trainer[remote]' (or {package})") from None
    except ValueError:
        raise ConfigError(f"a run directory at {url}: fsspec knows no scheme {protocol}://; "
                          "use s3://, gs:// or another fsspec URL") from None
    # a fresh instance (fsspec's cache would keep an endpoint the environment no longer
    # names) that lists the store each time it is asked (another writer may have written)
    fs = kind(skip_instance_cache=True, use_listings_cache=False, **options)
    return fs, fs._strip_protocol(url).rstrip("/")


def _status(text: str, code: int) -> bool:
    """Whether a message holds the HTTP status `code` (not as part of a port or a number:
    `127.0.0.1:40312` holds no 403)."""
    return re.search(rf"(?<![\d:.]){code}(?![\d])", text) is not None


def explain(error: BaseException, url: str) -> str:
    """What went wrong with the storage at `url`, in words a user can act on."""
    name = type(error).__name__
    text = (str(error).splitlines() or [name])[0].strip() or name
    # botocore raises NoCredentialsError; gcsfs without credentials goes on anonymously,
    # and Google's store answers 401 ("Anonymous caller does not have ... access")
    if ("Credentials" in name or "Unable to locate credentials" in text
            or "Anonymous caller" in text or _status(text, 401)):
        return (f"no credentials for {url} ({text}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for s3://, "
                "GOOGLE_APPLICATION_CREDENTIALS for gs://")
    if isinstance(error, PermissionError) or "AccessDenied" in text or _status(text, 403):
        return f"access to {url} is denied ({text}); grant this user read and write there"
    if isinstance(error, FileNotFoundError):
        return (f"the bucket of {url} does not exist ({text}); create it, or choose "
                "another hydra.run.dir")
    return (f"{url} cannot be reached ({name}: {text}); check the network and the endpoint "
            "(AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST)")


def _local_files(root: Path) -> dict[str, tuple[int, int]]:
    """The mirror's files (relative path -> size and modification time), without the
    local lock, the temporary names a write in progress uses, and `input_cache/` (a
    machine's own decoded copy of the data, which tf.data writes while it reads and builds
    again where it is missing). A push runs beside training (`trainer.rundir.inflight`), so
    a file or folder removed while they are listed is left out, not an error."""
    found = {}
    for folder, _, names in os.walk(root):  # a folder gone meanwhile: skipped
        for name in names:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if rel in (LOCK, LEASE) or rel.startswith(f"{LOCAL_ONLY}/") or any(
                    part.startswith(TMP) or (part.startswith(".") and part.endswith(".tmp"))
                    for part in rel.split("/")):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            if path.is_file():
                found[rel] = (stat.st_size, stat.st_mtime_ns)
    return found


def _backup_of(rel: str) -> str | None:
    """`backup/ckpt-X` for a file of that backup, else None."""
    parts = rel.split("/")
    return "/".join(parts[:2]) if len(parts) >= 3 and parts[0] == "backup" else None


def _is_marker(rel: str) -> bool:
    return _backup_of(rel) is not None and rel.endswith("/" + MARKER) and rel.count("/") == 2


@dataclass
class Mirror:
    """A run directory at `url` and its local mirror `root`.

    Attributes:
        url: the run directory's URL.
        root: the local mirror.
        fs, path: the URL's fsspec file system and the path in it.
        lease: the lease held on the URL (`trainer.rundir.lease.Lease`); None: reading only.
        sent: what the URL holds as the mirror last saw it: relative path -> (size, mtime)
            of the local file uploaded or downloaded (None: at the URL, not in the mirror).
    """

    url: str
    root: Path
    fs: Any
    path: str
    lease: Any = None
    sent: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    broken: bool = False  # a push failed: the URL keeps its last whole backup, untouched

    def _key(self, rel: str) -> str:
        return f"{self.path}/{rel}"

    def listing(self) -> list[str]:
        """What the URL holds, as paths relative to it (the lease left out).

        Raises:
            ConfigError: the bucket is missing, access is denied, no credentials, no network.
        """
        try:
            found = self.fs.find(self.path, detail=False)
        except Exception as error:  # noqa: BLE001 - every storage failure is one line
            raise ConfigError(explain(error, self.url)) from None
        rels = [key[len(self.path) + 1:] for key in found if key.startswith(self.path + "/")]
        return [rel for rel in rels if rel and rel != LEASE]

    def check_deletes(self) -> None:
        """Deletes an object that is not there: a store that lets this user write but not
        delete is found now, before anything is written at the URL (the lease too, which
        such a store would keep for good), not at the first backup rotation (where the stop
        and the rerun it advises would loop). A store checks the permission first: S3
        answers a permitted delete of a missing key with success, GCS with not found.

        Raises:
            ConfigError: the store refuses the delete (one line).
        """
        probe = self._key(f"{TMP}probe-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            self.fs.rm_file(probe)
        except FileNotFoundError:
            pass  # permitted, and not there
        except Exception as error:  # noqa: BLE001 - every storage failure is one line
            why = (str(error).splitlines() or [type(error).__name__])[0].strip()
            raise ConfigError(f"access to {self.url} is denied for deletes ({why}); a run "
                              "writes its backups and its lease there and removes the old "
                              "ones: grant write and delete (s3:PutObject and s3:DeleteObject, "
                              "storage.objects.create and .delete), or choose another "
                              "hydra.run.dir") from None

    def pull(self) -> bool:
        """Makes the mirror an exact copy of the URL's whole files (a backup cut short left
        out); returns whether the URL held anything. An empty URL leaves no mirror, so a run
        that fails at start leaves nothing, as in a new local directory."""
        rels = self.listing()
        whole = {_backup_of(rel) for rel in rels if _is_marker(rel)}
        wanted = [rel for rel in rels if (_backup_of(rel) is None or _backup_of(rel) in whole)
                  and not any(p.startswith(TMP) for p in rel.split("/"))]
        shutil.rmtree(self.root, ignore_errors=True)
        self.sent = dict.fromkeys(rels)  # what is not downloaded goes at the first push
        if not rels:
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            for rel in wanted:
                (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(self._key(rel), str(self.root / rel))
        except Exception as error:  # noqa: BLE001 - every storage failure is one line
            raise ConfigError(explain(error, self.url)) from None
        for rel in wanted:
            stat = (self.root / rel).stat()
            self.sent[rel] = (stat.st_size, stat.st_mtime_ns)
        return True

    def push(self) -> None:
        """Uploads what changed in the mirror since the last push (backup markers, then the
        summary, last) and removes from the URL what the mirror no longer holds.

        Raises:
            Interrupted: the lease was taken over, or the URL cannot be written: the run
                stops with the URL's last whole backup kept.
        """
        if self.broken or not self.root.is_dir():
            return
        if self.lease is not None:
            self.lease.check()
        files = _local_files(self.root)
        changed = [rel for rel, sig in sorted(files.items()) if self.sent.get(rel) != sig]
        order = ([r for r in changed if not _is_marker(r) and r != FINISHED]
                 + [r for r in changed if _is_marker(r)] + [r for r in changed if r == FINISHED])
        gone = sorted((rel for rel in self.sent if rel not in files),
                      key=lambda rel: (not _is_marker(rel), rel))
        try:
            for rel in order:
                self._put(rel, files[rel])
            for rel in gone:
                self.fs.rm_file(self._key(rel))
                del self.sent[rel]
        except Exception as error:  # noqa: BLE001 - every storage failure stops the run
            self.broken = True
            raise Interrupted(f"{explain(error, self.url)}; the run stopped, and the last "
                              f"backup that reached {self.url} is kept: rerun the same "
                              "command to resume from it") from None


    def _put(self, rel: str, signature: tuple[int, int]) -> None:
        """Uploads one file of the mirror, whole; one the run removed while the push ran
        (a checkpoint `keep_best` dropped) is left for the next push to reckon with."""
        try:
            self.fs.put_file(str(self.root / rel), self._key(rel))
        except FileNotFoundError:
            if (self.root / rel).exists():
                raise  # the store's, not the mirror's
            return
        self.sent[rel] = signature


@dataclass
class RunPlace:
    """The run's place, opened once for a command and closed at its end: a local folder,
    or, for a URL, its local mirror (`Mirror`, holding the URL's lease where this process
    writes there). The run writes into `root`; backups reach the URL through it
    (`committed`), and messages name the run by the user's URL through it (`shown`).

    Attributes:
        root: where the run writes (or reads): the local folder, or the URL's mirror.
        mirror: the URL's mirror; None for a local folder.
        role: `run` (the chief's: it writes the URL), `worker` (another worker's own mirror,
            never uploaded), or `read` (a copy `trainer.evaluate` and `.predict` read).
    """

    root: Path
    mirror: Mirror | None = None
    role: str = "run"

    @property
    def url(self) -> str:
        """What the user named: the URL, or the local folder."""
        return self.mirror.url if self.mirror is not None else str(self.root)

    def committed(self) -> None:
        """A backup in `root` is complete: where the chief mirrors a URL, the URL is
        brought in step (nothing for a local folder, or another worker's mirror)."""
        if self.mirror is not None and self.role == "run":
            self.mirror.push()

    def shown(self, text: str) -> str:
        """`text` with the mirror's local path written as its URL (what the user named)."""
        if self.mirror is None:
            return text
        return text.replace(str(self.mirror.root), self.mirror.url)

    def by_url(self, value: Any) -> Any:
        """`value` (text, or a JSON-like dict or list of it) with every path in the mirror
        written as its URL (`shown`)."""
        if isinstance(value, str):
            return self.shown(value)
        if isinstance(value, dict):
            return {key: self.by_url(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.by_url(item) for item in value]
        return value

    def named(self, error: BaseException) -> None:
        """An error's message (and its cause's, which its one line may quote) names the URL
        where it names the mirror (removed at the end)."""
        for each in (error, error.__cause__):
            if (each is not None and each.args and isinstance(each.args[0], str)
                    and self.shown(each.args[0]) != each.args[0]):
                each.args = (self.shown(each.args[0]), *each.args[1:])

    def close(self, error: BaseException | None = None) -> None:
        """Ends the place: for the chief's mirror, the rest uploaded (after a failure,
        where it can: a URL that cannot be written is one warning line, the run's own error
        stays the one it ends with) and the lease released; the local mirror removed
        (`TRAINER_KEEP_SCRATCH=1` keeps the chief's and a read copy; another worker's
        goes). Nothing for a local folder.

        Raises:
            Interrupted: the URL could not be written at the end of a run that ended well
                (its last backup is kept).
        """
        if self.mirror is None:
            return
        try:
            if self.role == "run" and error is None:
                self.mirror.push()
            elif self.role == "run":
                _push_after_failure(self.mirror)
        finally:
            if self.mirror.lease is not None:
                self.mirror.lease.release(quiet=self.mirror.broken)
            if self.role == "worker" or not keep_scratch():  # the URL holds the run
                shutil.rmtree(self.root, ignore_errors=True)


def _push_after_failure(mirror: Mirror) -> None:
    """What a failed run wrote (its log, a backup a signal's stop wrote) reaches the URL
    where it can; a URL that cannot be written is said in one line."""
    try:
        mirror.push()  # nothing where a push failed already (the run's own error)
    except Exception as error:  # noqa: BLE001 - the run's own error is what it reports
        print(f"warning: {error}", file=sys.stderr, flush=True)


def fetch(url: str) -> RunPlace:
    """A copy of the run directory at `url` to read (`trainer.evaluate`, `trainer.predict`):
    its whole files, downloaded into a mirror of their own; returns its place (`read`).

    Raises:
        ConfigError: the URL holds nothing, or cannot be read (one line).
    """
    fs, path = filesystem(url)
    mirror = Mirror(url, scratch(url, "read"), fs, path)
    if not mirror.pull():
        raise ConfigError(f"{url} holds no run (nothing is there); pass the URL of an "
                          "earlier run's directory")
    return RunPlace(mirror.root, mirror, "read")


def upload(url: str, local: Path, name: str) -> str:
    """Puts one local file at `url/name` (whole, one PUT); returns its URL."""
    fs, path = filesystem(url)
    try:
        fs.put_file(str(local), f"{path}/{name}")
    except Exception as error:  # noqa: BLE001 - every storage failure is one line
        raise ConfigError(explain(error, url)) from None
    return f"{url.rstrip('/')}/{name}"
