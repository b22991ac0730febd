"""The synthesizer finds known equalities, keeps only verified ones, and writes a loadable file."""

from pathlib import Path

from eqsat.rewrites import load_rules
from eqsat.rewrites.synth import SynthOptions, synthesize
from eqsat.rewrites.verify import verify_concrete


def test_small_synthesis_writes_verified_rules(tmp_path: Path) -> None:
    out = tmp_path / "s.rules"
    report = synthesize(SynthOptions(max_ops=2, time_limit=60, ops=("ewadd", "ewmul", "transpose", "relu")), out)
    assert report["kept"] == report["verified"] > 0 and report["candidates"] >= report["kept"]
    rules = load_rules(out)
    assert len(rules) == report["kept"]
    texts = {r.text() for r in rules}
    assert "(ewadd ?x ?y) => (ewadd ?y ?x)" in texts
    for r in rules[:5]:
        assert verify_concrete(r).proved
