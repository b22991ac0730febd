"""`@eqsat.optimize`'s keep/discard decisions, persisted so that they hold across processes.

A decision (`jax_backend.timing.Decision`, from the sequential test) is stored per (program hash,
signature, device) in `cache_dir("decisions")`, one JSON file per key, written atomically. A
second process that captures the same program with the same candidates on the same device reads
the decision back instead of timing again (the candidates are still built and checked against the
original: only the timing is skipped). A damaged entry (unreadable, not this format, another key)
is ignored with an `EqsatCacheWarning` and overwritten by the next decision; an unwritable cache
only costs timing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from eqsat.atomic_write import atomic_write_text
from eqsat.ir import Graph
from eqsat.paths import cache_dir
from jax_backend.timing import Decision

__all__ = ["DECISION_FORMAT", "DecisionKey", "EqsatCacheWarning", "decisions_dir", "device_name", "load_decision",
           "program_hash", "save_decision"]

DECISION_FORMAT = 1


class EqsatCacheWarning(UserWarning):
    """A cache entry could not be used (damaged or of another format); it is recomputed."""


def decisions_dir() -> Path:
    return cache_dir("decisions")


def device_name() -> str:
    """The device a timing holds for: platform, kind and count of JAX devices, and for a CPU the
    host's architecture and core count (another machine times differently)."""
    dev = jax.devices()[0]
    host = f":{platform.machine()}:{os.cpu_count()}" if dev.platform == "cpu" else ""
    return f"{dev.platform}:{getattr(dev, 'device_kind', dev.platform)}:{jax.device_count()}{host}"


def _step_text(step: Any) -> Any:
    """A stable description of one program step: an IR graph as its JSON; an opaque equation by its
    primitive and value ids (its params may hold functions whose repr changes per process)."""
    if hasattr(step, "graph"):
        return ["graph", step.graph.to_json(), list(step.inputs), list(step.outputs)]
    return ["opaque", str(step.eqn.primitive), list(step.inputs), list(step.outputs)]


def program_hash(program: Any, variants: Sequence[tuple[str, Sequence[Graph]]], extra: Sequence[str] = ()) -> str:
    """SHA-256 of what a decision depends on: the captured program (constants by shape and dtype,
    not value: values do not change speed), each candidate's graphs, the JAX version and `extra`
    (the lowering mode, the margin)."""
    consts = sorted((k, list(getattr(v, "shape", ())), str(getattr(v, "dtype", type(v).__name__)))
                    for k, v in program.consts.items())
    text = json.dumps({"jax": [jax.__version__, getattr(jax, "__version_info__", "")], "extra": list(extra),
                       "n_inputs": program.n_inputs, "outputs": list(program.outputs), "consts": consts,
                       "steps": [_step_text(s) for s in program.steps],
                       "variants": [[label, [g.to_json() for g in graphs]] for label, graphs in variants]},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class DecisionKey:
    program: str  # `program_hash`
    signature: str
    device: str  # `device_name`

    def fields(self) -> dict[str, str]:
        return {"program": self.program, "signature": self.signature, "device": self.device}

    def path(self, root: Path | None = None) -> Path:
        digest = hashlib.sha256(json.dumps(self.fields(), sort_keys=True).encode()).hexdigest()
        return (decisions_dir() if root is None else root) / f"{digest[:40]}.json"


def load_decision(key: DecisionKey, root: Path | None = None) -> tuple[str, Decision] | None:
    """(candidate label, decision) stored for `key`; None when there is none or it is damaged
    (then with an `EqsatCacheWarning`)."""
    path = key.path(root)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.warn(f"eqsat.optimize: ignoring unreadable decision cache entry {path}: {exc}", EqsatCacheWarning,
                      stacklevel=2)
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != DECISION_FORMAT:
            raise ValueError(f"not decision format {DECISION_FORMAT}")
        if data.get("key") != key.fields():
            raise ValueError("stored for another key")
        label = data.get("label")
        if not isinstance(label, str):
            raise ValueError("no candidate label")
        return label, Decision.from_json(data.get("decision"))
    except (ValueError, TypeError, KeyError) as exc:
        warnings.warn(f"eqsat.optimize: ignoring damaged decision cache entry {path} ({exc}); timing again",
                      EqsatCacheWarning, stacklevel=2)
        return None


def save_decision(key: DecisionKey, label: str, decision: Decision, root: Path | None = None) -> None:
    """Store `decision` (of candidate `label`) for `key`; a cache that cannot be written is skipped."""
    payload = {"format": DECISION_FORMAT, "key": key.fields(), "label": label, "decision": decision.to_json()}
    try:
        atomic_write_text(key.path(root), json.dumps(payload, indent=1, sort_keys=True))
    except OSError:
        pass
