"""One command from rank 0 to the other ranks, as two int64 tensors (header, payload).

Rank 0 schedules; every other rank runs the same forward on its part of the weights, so it must
see the same step. A step is sent as the scheduler's decision in plain numbers: each admitted
prompt (its lane, token ids and reserved KV slots) and each decoding sequence (its lane, the
token it just sampled, the position that token takes). The other ranks keep a copy of every lane's
sequence (`Shadows`) and build the step's tensors with the same `build_step` rank 0 uses, so the
two cannot disagree. Wire format: a fixed header, then one payload of
    (lane, prompt length, slot count) per prefill, (lane, token, position) per decode,
    every prompt's ids, every prefill's slots.
Worked example: a step that admits a 2-token prompt on lane 3 (slots 7, 8, 9 reserved) while lane 0
decodes token 65 at position 5:
    header  [STEP, 1, 1, 2, 3, 0]     payload  [3, 2, 3,  0, 65, 5,  104, 105,  7, 8, 9]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch

from moelab.engine.scheduler import SamplingParams, Sequence

HEADER = 6  # kind, prefills, decodes, prompt tokens, slots, argument


class Kind(IntEnum):
    STEP = 1  # run this step's forward
    IDLE = 2  # nothing to do: a heartbeat, so waiting ranks never reach their collective timeout
    STOP = 3  # exit 0
    WARM_MOE = 4  # compile the MoE kernels for steps of up to `arg` tokens (CUDA)
    CAPTURE = 5  # capture the decode CUDA graphs


@dataclass
class Command:
    kind: Kind
    prefills: list[tuple[int, list[int], list[int]]] = field(default_factory=list)  # (lane, prompt ids, slots)
    decodes: list[tuple[int, int, int]] = field(default_factory=list)  # (lane, token, position)
    arg: int = 0


def step_command(prefill: list[Sequence], decode: list[Sequence]) -> Command:
    return Command(Kind.STEP, [(s.lane, s.prompt_ids, s.slots) for s in prefill],
                   [(s.lane, s.output_ids[-1], s.length - 1) for s in decode])


def encode(cmd: Command) -> tuple[torch.Tensor, torch.Tensor]:
    """(header [HEADER], payload [n]) int64 on the CPU."""
    n_tok = sum(len(p) for _, p, _ in cmd.prefills)
    n_slot = sum(len(s) for _, _, s in cmd.prefills)
    header = torch.tensor([int(cmd.kind), len(cmd.prefills), len(cmd.decodes), n_tok, n_slot, cmd.arg],
                          dtype=torch.long)
    flat: list[int] = []
    for lane, prompt, slots in cmd.prefills:
        flat += (lane, len(prompt), len(slots))
    for d in cmd.decodes:
        flat += d
    for _, prompt, _ in cmd.prefills:
        flat += prompt
    for _, _, slots in cmd.prefills:
        flat += slots
    return header, torch.tensor(flat, dtype=torch.long)


def payload_size(header: torch.Tensor) -> int:
    _, n_pre, n_dec, n_tok, n_slot, _ = header.tolist()
    return 3 * n_pre + 3 * n_dec + n_tok + n_slot


def decode(header: torch.Tensor, payload: torch.Tensor) -> Command:
    kind, n_pre, n_dec, _, _, arg = header.tolist()
    flat = payload.tolist()
    heads = [flat[3 * i:3 * i + 3] for i in range(n_pre)]
    at = 3 * n_pre
    decodes = [tuple(flat[at + 3 * i:at + 3 * i + 3]) for i in range(n_dec)]
    at += 3 * n_dec
    prompts = []
    for _, n, _ in heads:
        prompts.append(flat[at:at + n])
        at += n
    prefills = []
    for (lane, _, n), prompt in zip(heads, prompts):
        prefills.append((lane, prompt, flat[at:at + n]))
        at += n
    return Command(Kind(kind), prefills, decodes, arg)  # type: ignore[arg-type]


_NO_PARAMS = SamplingParams(max_tokens=0)


class Shadows:
    """A rank's copy of every running lane's sequence (token ids and KV slots only), kept in step
    with rank 0 by the commands; `step()` gives the (prefill, decode) lists `build_step` takes."""

    def __init__(self) -> None:
        self.lanes: dict[int, Sequence] = {}

    def step(self, cmd: Command) -> tuple[list[Sequence], list[Sequence]]:
        decode = []
        for lane, token, pos in cmd.decodes:
            seq = self.lanes[lane]
            seq.output_ids.append(token)
            if seq.length - 1 != pos:
                raise RuntimeError(f"this rank's copy of lane {lane} is at position {seq.length - 1}, rank 0 "
                                   f"sent position {pos}: the ranks' steps have diverged")
            decode.append(seq)
        prefill = []
        for lane, prompt, slots in cmd.prefills:
            seq = Sequence(f"lane{lane}", prompt, _NO_PARAMS, slots=slots, lane=lane)
            self.lanes[lane] = seq
            prefill.append(seq)
        return prefill, decode
