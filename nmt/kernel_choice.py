"""What ``auto`` is asked (``Request``: the config's settings, 'auto' where left to it) and what a
run uses (``Choice``), with the names of the candidates timed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from nmt.config import ModelConfig, TrainConfig

# The attention "kernel" of a model that has none to choose (the RNN: its attention is a few small
# products of its own), so that neither the log nor a cached choice names one it does not use.
NO_KERNEL = "none"


@dataclass(frozen=True)
class Request:
    """What the config asks for; 'auto' is measured."""

    precision: str = "auto"
    attention: str = "auto"
    threads: int | str = "auto"
    fp32_matmul: str = "auto"

    @property
    def named_fp32_matmul(self) -> str:
        """The product library asked for, the BLAS where the choice is left to ``auto``."""
        return "blas" if self.fp32_matmul == "auto" else self.fp32_matmul

    @classmethod
    def from_train(cls, t: TrainConfig, precision: str | None = None) -> Request:
        threads = "auto" if t.threads is None else t.threads
        return cls(precision or t.precision, t.attention, threads, t.fp32_matmul)


@dataclass(frozen=True)
class Choice:
    """The settings a run uses, with the step times (ms) they were chosen on."""

    precision: str
    attention: str
    threads: int | None  # CPU intra-op threads; None on a GPU
    timings: dict[str, dict[str, float]] = field(default_factory=dict)  # dimension -> candidate -> ms
    source: str = "config"  # config | measured | cached | kept (by a resumed run: run_record)
    measured_on: str = ""
    cpu_use: float | None = None  # CPU time / (wall time x threads) while measuring, on a CPU
    fp32_matmul: str = "blas"  # library of fp32 CPU products: blas or onednn
    decode_attention: str | None = None  # the kernel for decoding, where measured apart; None: ``attention``
    decode_fp32_matmul: str | None = None  # the library for decoding, where measured apart; None: ``fp32_matmul``

    def decoding(self) -> tuple[str, str]:
        """(attention kernel, fp32 product library) for decoding."""
        return self.decode_attention or self.attention, self.decode_fp32_matmul or self.fp32_matmul

    def describe(self) -> str:
        """One line for the log: the choice, and the figures it was made on."""
        threads = "" if self.threads is None else f", {self.threads} thread{'' if self.threads == 1 else 's'}"
        cpu_fp32 = self.precision == "fp32" and self.threads is not None
        library = f", fp32 matmul {self.fp32_matmul}" if cpu_fp32 else ""
        kernel = "" if self.attention == NO_KERNEL else f", attention {self.attention}"
        head = f"precision {self.precision}{library}{kernel}{threads}"
        attention, fp32_matmul = self.decoding()
        if (attention, fp32_matmul) != (self.attention, self.fp32_matmul):
            parts = [] if attention == NO_KERNEL else [f"attention {attention}"]
            parts += [f"fp32 matmul {fp32_matmul}"] if cpu_fp32 else []
            if parts:
                head += "; decoding with " + ", ".join(parts)
        if not self.timings:
            return f"{head} (from the config)"
        figures = "; ".join(
            f"{dim}: " + ", ".join(f"{name} {ms:.1f}" for name, ms in options.items())
            for dim, options in self.timings.items()
        )
        where = {"cached": "cached from an earlier measurement", "kept": "kept from the run's start"}.get(
            self.source, "measured now"
        )
        return f"{head} ({where} on {self.measured_on}; ms per tuning step: {figures})"

    def to_dict(self) -> dict:
        return asdict(self)


def has_attention_kernel(model: ModelConfig) -> bool:
    """Whether ``model`` computes attention with a kernel to choose (``train.attention``): the Transformer."""
    return model.type == "transformer"


def for_model(request: Request, model: ModelConfig) -> Request:
    """``request`` with no attention kernel to measure or name for a model that has none."""
    return request if has_attention_kernel(model) else replace(request, attention=NO_KERNEL)


def candidate(first: str, kernel: str) -> str:
    """A timed candidate's name: "precision/kernel" or "library/kernel", the first part alone
    where the model has no kernel."""
    return first if kernel == NO_KERNEL else f"{first}/{kernel}"
