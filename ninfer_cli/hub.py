"""Talking to the Hub: endpoint, offline mode, the metadata HEAD, and its errors as one line each.

huggingface_hub reads `HF_ENDPOINT` and `HF_HUB_OFFLINE` once, at import; these helpers read them when
called, so a setting made after import (a test, a wrapper script) still counts. `HF_TOKEN` is read by
huggingface_hub itself on every request.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from engine.errors import NinferError
from ninfer_cli.catalog import HubFile

_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Remote:
    """What the metadata HEAD told us about a file."""

    url: str
    size: int | None
    etag: str | None
    commit: str | None


def endpoint() -> str:
    """The Hub base URL: `$HF_ENDPOINT` read now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants  # noqa: PLC0415

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    """True when `HF_HUB_OFFLINE` or `NINFER_OFFLINE` asks for no network (read now, not at import)."""
    from huggingface_hub import constants  # noqa: PLC0415

    env = any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "NINFER_OFFLINE"))
    return env or bool(constants.HF_HUB_OFFLINE)


def hub_error(e: Exception, f: HubFile, ref: str) -> NinferError:
    """One line with the next action for whatever the Hub or the network answered."""
    from huggingface_hub import errors as hf  # noqa: PLC0415

    where = f"{f.repo}@{f.revision[:12]}"
    if isinstance(e, hf.OfflineModeIsEnabled):
        return offline_error(ref)
    if isinstance(e, hf.GatedRepoError):
        return NinferError(
            f"{f.repo} is a gated repository and " + ("this token has no access to it" if _has_token()
                                                       else "no Hugging Face token is set"),
            f"accept its terms at {endpoint()}/{f.repo}, then set HF_TOKEN (or run `hf auth login`) and pull again",
        )
    if isinstance(e, hf.RepositoryNotFoundError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            return NinferError(
                f"the Hub refused access to {f.repo} (HTTP {status})",
                "set HF_TOKEN to a token that can read it (or run `hf auth login`); a private or gated "
                "repository also needs its access granted on the website",
            )
        return NinferError(f"repository {f.repo} not found on {endpoint()}", "check HF_ENDPOINT; the pin may be stale")
    if isinstance(e, hf.RevisionNotFoundError):
        return NinferError(f"revision {f.revision[:12]} of {f.repo} not found", "the catalog pin is stale: update ninfer")
    if isinstance(e, hf.EntryNotFoundError):
        return NinferError(f"{f.filename} not found in {where}", "the catalog pin is stale: update ninfer")
    if isinstance(e, hf.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", "?")
        if status in (401, 403):
            return NinferError(
                f"the Hub refused {f.filename} from {where} (HTTP {status})",
                "set HF_TOKEN to a token with read access (or run `hf auth login`) and pull again",
            )
        return NinferError(f"the Hub answered HTTP {status} for {f.filename} from {where}", "try again later")
    return NinferError(
        f"cannot reach {endpoint()}: {type(e).__name__}: {e}".rstrip(": "),
        f"check the network (or HF_ENDPOINT), then run `ninfer pull {ref}` again; partial files are kept",
    )


def _has_token() -> bool:
    try:
        from huggingface_hub import get_token  # noqa: PLC0415

        return bool(get_token())
    except Exception:
        return False


def offline_error(ref: str) -> NinferError:
    return NinferError(
        f"offline mode is on (HF_HUB_OFFLINE or NINFER_OFFLINE): cannot download {ref}",
        "unset HF_HUB_OFFLINE/NINFER_OFFLINE, or register a local file with `ninfer pull --from PATH`",
    )


def resolve(f: HubFile, ref: str, token: str | bool | None = None) -> Remote:
    """HEAD the pinned file on the Hub: size, etag, commit. Raises NinferError with the next action."""
    if offline():
        raise offline_error(ref)
    import httpx2  # noqa: PLC0415  (huggingface_hub's HTTP client)
    from huggingface_hub import get_hf_file_metadata, hf_hub_url  # noqa: PLC0415
    from huggingface_hub import errors as hf  # noqa: PLC0415

    url = hf_hub_url(f.repo, f.filename, revision=f.revision, endpoint=endpoint())
    try:
        meta = get_hf_file_metadata(url, token=token, endpoint=endpoint())
    except (hf.HfHubHTTPError, hf.OfflineModeIsEnabled, httpx2.TransportError, OSError) as e:
        raise hub_error(e, f, ref) from None
    return Remote(url=url, size=meta.size, etag=meta.etag, commit=meta.commit_hash)
