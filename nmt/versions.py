"""The oldest releases of its dependencies nmt runs on: pyproject.toml's floors, checked from the
packages' metadata (importing torch takes seconds), so that an older one is refused in one line
instead of failing later on an API it lacks, or giving wrong output in silence."""

from __future__ import annotations

import importlib.metadata
import re

from nmt.errors import NMTError

# torch 2.2 has no torch.amp.GradScaler (every `nmt train` stopped in a traceback), no CPU loss
# scaling, and its wheels cannot read NumPy 2 arrays; on 2.3.1 a port already taken added torch's own
# lines to our one-line error. The suite ran on 2.4.1 (README, "Set-up").
# sentencepiece 0.2.0-0.2.2 turn a tab into ' ⁇ ' under the nfkc and identity normalizations.
OLDEST = {"torch": "2.4.1", "sentencepiece": "0.2.3"}
# Needed only to read a Hugging Face dataset, so checked there (nmt.hf_corpus): 2.14 and 2.15 lack
# datasets.exceptions (2.14 does not even import beside a current pyarrow), and 2.16 and 2.17 cannot
# read a CSV or TSV data file with the pandas 3 pip installs beside them.
OLDEST_DATASETS = "2.18"


def release(version: str) -> tuple[int, ...]:
    """A version's release numbers: "2.13.0+cpu" -> (2, 13, 0), "2.4.0a0+git1" -> (2, 4, 0)."""
    numbers = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in numbers.group(0).split(".")) if numbers else ()


def older_than(package: str, oldest: str) -> str | None:
    """The installed version of ``package`` where it is older than ``oldest``, else None (also where
    it is missing or has no metadata, built in place: its import says, or it is not judged)."""
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    return installed if release(installed) < release(oldest) else None


def check_dependencies() -> None:
    """Refuse, in one line naming the pip install that fixes it, a dependency older than OLDEST."""
    for package, oldest in OLDEST.items():
        installed = older_than(package, oldest)
        if installed is not None:
            fix = f"pip install '{package}>={oldest}'"
            raise NMTError(f"{package} {installed} is older than {oldest}, the oldest nmt runs on: {fix}")
