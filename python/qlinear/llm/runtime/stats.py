"""Figures of a generation (and of loading), as mnn-llm's demo prints them."""

from __future__ import annotations

import resource
from dataclasses import dataclass


def peak_rss_mb() -> float:
    """This process's peak resident set, MB: VmHWM (its own since exec; ru_maxrss would carry
    over the parent's peak into a child process on Linux), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Stats:
    """Figures of the last generation (and of loading), as mnn-llm's demo prints them."""

    load_s: float = 0.0
    prompt_tokens: int = 0
    reused_tokens: int = 0   # prompt tokens whose keys / values the cache already held
    prefill_s: float = 0.0
    decode_tokens: int = 0   # tokens generated (the first comes from the prefill's logits)
    decode_steps: int = 0    # forwards that decoding ran (one token each, or a verification)
    step_tokens: int = 0     # tokens decided from those forwards' logits
    decode_s: float = 0.0    # time of those forwards and of sampling (and drafting)
    draft_tokens: int = 0    # speculative decoding: tokens drafted, and those the model kept
    accepted_tokens: int = 0
    finish_reason: str = ""

    @property
    def prefill_tok_s(self) -> float:
        return (self.prompt_tokens - self.reused_tokens) / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.step_tokens / self.decode_s if self.decode_s and self.step_tokens else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Speculative decoding: the fraction of drafted tokens the model kept."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.step_tokens / self.decode_steps if self.decode_steps else 0.0

    @property
    def peak_rss_mb(self) -> float:
        return peak_rss_mb()

    def __str__(self) -> str:
        spec = (f" (speculative: {self.accepted_tokens} of {self.draft_tokens} drafted tokens kept, "
                f"{self.tokens_per_step:.2f} tokens per step)") if self.draft_tokens else ""
        return (f"prefill {self.prompt_tokens - self.reused_tokens} tokens in {self.prefill_s:.3f} s ({self.prefill_tok_s:.1f} tok/s), "
                f"decode {self.decode_tokens} tokens in {self.decode_s:.3f} s ({self.decode_tok_s:.1f} tok/s){spec}, "
                f"load {self.load_s:.2f} s, peak RSS {self.peak_rss_mb:.0f} MB")
