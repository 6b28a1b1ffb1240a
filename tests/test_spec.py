from moelab.registry import Registry
from moelab.spec import Cause, LaunchSpec, Verdict, Phase


def test_flag_lookup_last_wins_and_equals_form():
    s = LaunchSpec(args=["--tp", "2", "--moe-runner-backend=triton", "--tp", "8"])
    assert s.flag("--tp") == "8"
    assert s.flag("--moe-runner-backend") == "triton"
    assert s.flag("--quantization") is None


def test_verdict_roundtrip_json():
    v = Verdict(cause=Cause.host_oom, phase=Phase.launch, advice="lower it")
    assert Verdict.model_validate_json(v.model_dump_json()) == v
    assert v.model_dump(mode="json")["cause"] == "host_oom"
    assert not v.ok


def test_registry_unknown_name_lists_known():
    r: Registry[int] = Registry("thing")
    r.register("a")(lambda: 1)
    assert r.create("a") == 1
    try:
        r.create("b")
    except KeyError as e:
        assert "known: a" in str(e)
    else:
        raise AssertionError("unknown name accepted")
