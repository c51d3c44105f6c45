"""A request and its sampling parameters."""
from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 32
    stop_token_ids: tuple[int, ...] = ()


class Status(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    slot: int = -1
    finish_reason: str | None = None
    preemptions: int = 0
    arrival_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None
    text: str = ""

    @property
    def context(self) -> list[int]:
        """Tokens whose state must exist before the next decode step (recompute prefills all but the
        last, which the next decode step consumes)."""
        return self.prompt_ids + self.output_ids

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def done(self) -> bool:
        return self.status is Status.FINISHED
