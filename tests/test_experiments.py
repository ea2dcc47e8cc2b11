"""The lesson experiments: their key numbers, against independent oracles.

Each experiment runs with its QUICK sizes (seconds), except where a number of
the numerics documents is asserted; those cases need only small inputs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fpemu import experiments


@pytest.fixture(scope="module")
def quick():
    """Every experiment once, reduced sizes."""
    return {name: experiments.run(name, quick=True) for name in experiments.ORDER}


def test_every_experiment_has_config_quick_run_and_a_result(quick):
    for name, r in quick.items():
        s = r.summary()
        assert isinstance(s, dict) and s and r.title in str(s)
        assert r.question.endswith("?") and r.setup and r.conclusion.count(".") >= 2
        json.dumps(r.to_json())                       # numbers, config: all JSON
        figs = r.plot()
        assert figs, name
        for fig in figs.values():
            labelled = [ax for ax in fig.axes if ax.get_xlabel() or ax.get_ylabel()]
            assert labelled, f"{name}: a figure without axis labels"
        import matplotlib.pyplot as plt
        for fig in figs.values():
            plt.close(fig)


def test_unknown_parameter_and_experiment_say_what_exists():
    with pytest.raises(TypeError, match="has no parameter stepz; its parameters are .*steps"):
        experiments.run("loss_scaling", stepz=3)
    with pytest.raises(KeyError, match="the experiments are underflow, loss_scaling"):
        experiments.run("nope")
    with pytest.raises(ValueError, match="loss_scaling: steps must be an int >= 1, got 0"):
        experiments.run("loss_scaling", steps=0)
    with pytest.raises(ValueError, match="loss_scaling: scaler must be one of torch, deepspeed, "
                                         "megatron, apex, got 'amp'"):
        experiments.run("loss_scaling", scaler="amp", steps=1)
    with pytest.raises(ValueError, match="attention: temperature must be a finite number > 0"):
        experiments.run("attention", temperature=float("nan"))
    with pytest.raises(ValueError, match="spike_step must be below steps \\(10\\), got 40"):
        experiments.run("fp8_training", steps=10)


def test_master_weights_reproduce_the_numerics_tables():
    """docs/pytorch-numerics.md §4 (bf16 stagnation) and the 256 - 0.009 x 200 example."""
    r = experiments.run("master_weights", quick=True)
    t = r.numbers["bf16_sgd_table"]
    assert t["0.0001"]["pure_bf16"] == [1.0, 1.0, 1.0]
    assert t["0.001"]["pure_bf16"] == [1.0, 1.0, 1.0]
    assert t["0.003"]["pure_bf16"] == [0.99609375, 0.9609375, 0.609375]
    for lr, master, model in (("0.0001", "0.98999834", 0.98828125),
                              ("0.001", "0.90000129", 0.8984375),
                              ("0.003", "0.69999790", 0.69921875)):
        assert np.float32(t[lr]["fp32_master"]) == np.float32(master)
        assert t[lr]["bf16_of_master"] == model
    assert r.numbers["fp16_weight_after_updates"] == 256.0
    # oracle: numpy float32 (IEEE, correctly rounded), the fp16 update widened exactly
    g = np.float32(np.float16(0.009))
    w = np.float32(256.0)
    for _ in range(200):
        w = np.float32(w - g)
    assert np.float32(r.numbers["fp32_master_after_updates"]) == w
    assert r.numbers["fp16_model_copy_after_updates"] == float(np.float16(w))


def test_adam_epsilon_blow_up_threshold_and_fixes():
    """docs/pytorch-numerics.md §6 E5a / E5b: -inf for |g| <= 5.4588e-3, NaN for g = 0."""
    import fpemu
    r = experiments.run("adam_epsilon", g_lo=2.0**-9, g_hi=2.0**-7)
    n = r.numbers
    assert n["eps_in_fp16"] == 0.0
    assert f"{n['largest_g_giving_minus_inf']:.5g}" == "0.0054588"
    assert fpemu.next_up(n["largest_g_giving_minus_inf"], "fp16") == \
        n["smallest_g_staying_finite"]
    v = n["variants"]
    assert np.isnan(v["fp16, eps 1e-08"]["g0_result"]) and v["fp16, eps 1e-08"]["nan"] == 1
    for k in ("fp16, eps 0.0001", "fp16, eps 1e-08, fused", "fp16 + fp32 master, eps 1e-08",
              "bf16, eps 1e-08", "fp32, eps 1e-08"):
        assert v[k]["nan"] == 0 and v[k]["neg_inf"] == 0, k
    assert v["bf16, eps 1e-08"]["max_step_over_lr"] == 0.0      # p stays exactly 1 (E5b)
    assert v["fp16, eps 0.0001"]["max_step_over_lr"] > 10


def test_underflow_counts_match_an_independent_fp16_oracle(quick):
    r = quick["underflow"]
    act = np.concatenate([g.ravel() for g in r.data["act"].values()]).astype(np.float64)
    for scale in (1.0, 1024.0):
        a = np.abs(act * scale)
        # fp16 under RNE: below 2^-25 rounds to 0; exactly 2^-25 ties to even (0)
        flushed = np.mean((a > 0) & (a <= 2.0**-25))
        key = "fp16_flushed_activation_grads" + ("" if scale == 1 else "_x1024")
        assert r.numbers[key] == flushed
    t = r.numbers["table"]
    flushed = [t[f"fp16 x{s:g}"]["flushed"] for s in r.config.scales]
    assert flushed == sorted(flushed, reverse=True)          # a larger scale flushes less
    assert all(t[f"bf16 x{s:g}"]["flushed"] == 0 for s in r.config.scales)


def test_underflow_default_run_stalls_without_scaling_and_matches_with_it():
    r = experiments.run("underflow", steps=120, record_steps=1)
    keys = ("final_loss_fp32", "final_loss_fp16_no_scaling", "final_loss_fp16_dynamic_scaling")
    f = {k: r.numbers[k] for k in keys}
    assert f["final_loss_fp16_no_scaling"] > 1.1 * f["final_loss_fp32"]
    assert abs(f["final_loss_fp16_dynamic_scaling"] - f["final_loss_fp32"]) < \
        0.01 * f["final_loss_fp32"]


def test_loss_scale_trajectory_follows_the_gradscaler_rules(quick):
    """Oracle: halve on a skipped step, double after growth_interval clean steps."""
    r = quick["loss_scaling"]
    c = r.config
    scales, skipped = r.data["scales"], r.data["skipped"]
    s, clean = c.init_scale, 0
    for step in range(c.steps):
        assert scales[step] == s, step
        if skipped[step]:
            s, clean = s * 0.5, 0
        else:
            clean += 1
            if clean == c.growth_interval:
                s, clean = s * 2.0, 0
    assert set(r.numbers["skipped_at"]) >= set(c.spikes)


@pytest.mark.parametrize("kind", ["deepspeed", "megatron", "apex"])
def test_the_frameworks_scalers_in_the_loop_follow_their_rules(kind):
    """Oracle: each framework's rule written out here (hysteresis 2 refilled
    at a growth, floor 1; APEX's ceiling 2**24; DeepSpeed counts its window
    from the step after an overflow, so it grows one clean step later), on
    the experiment's own skips."""
    c = dict(steps=60, spikes=(5, 6, 7, 30), growth_interval=4, width=8, batch=32,
             init_scale=2.0 ** 20)
    r = experiments.run("loss_scaling", scaler=kind, **c)
    scales, skipped = r.data["scales"], r.data["skipped"]
    s, clean, hyst = c["init_scale"], 0, 2
    grew, last_overflow = 0, -1
    for step in range(c["steps"]):
        assert scales[step] == s, step
        if skipped[step]:
            clean, last_overflow = 0, step
            if kind == "apex":
                s = s / 2
            else:
                hyst -= 1
                if hyst <= 0:
                    s = max(s / 2, 1.0)
        elif kind == "deepspeed":
            stable = step - last_overflow - 1
            if stable > 0 and stable % c["growth_interval"] == 0:
                s, hyst = s * 2, 2
                grew += 1
        else:
            clean += 1
            if clean == c["growth_interval"]:
                s, clean, hyst = (min(s * 2, 2.0 ** 24) if kind == "apex" else s * 2), 0, 2
                grew += 1
    assert set(c["spikes"]) <= set(r.numbers["skipped_at"]) and grew >= 2


def test_range_precision_attention_fp8_accumulation_sr(quick):
    rp = quick["range_precision"].numbers
    assert rp["fp32"]["zero_gradients"] == 0.0
    assert rp["bf16"]["lost_updates"] > rp["fp32"]["lost_updates"]
    at = quick["attention"].numbers["variants"]
    assert at["fp32"]["max_abs_error_P"] < 1e-6
    assert at["softmax in bf16"]["max_row_sum_error"] > 100 * at["fp32"]["max_row_sum_error"]
    f8 = quick["fp8_training"].numbers
    assert f8["saturated_total_current"] == 0 and f8["saturated_at_spike_delayed"] > 0
    ac = quick["accumulation"].numbers
    k = ac["ks"][-1]
    assert ac[f"promoted_at_K{k}"] < ac[f"h100_fp8_at_K{k}"]
    assert ac[f"fp32_acc_at_K{k}"] < 1e-5 < ac[f"bf16_acc_at_K{k}"]
    sr = quick["stochastic_rounding"].numbers
    assert sr["final_loss"]["bf16 sr"] < sr["final_loss"]["bf16 rne"]
    assert sr["updates_lost_rne"] > sr["updates_lost_sr"]


def test_accumulation_fp8_error_grows_with_k_and_promotion_caps_it():
    r = experiments.run("accumulation", ks=(128, 1024, 4096), rows=2, cols=2)
    h = r.numbers["max_rel_error"]["e4m3fn, h100-fp8"]
    p = r.numbers["max_rel_error"]["e4m3fn, h100-fp8 + fp32 every 128"]
    assert h[0] < h[1] < h[2] and h[2] > 0.01          # percent-level at K = 4096
    assert p[0] == h[0]                               # one block: nothing to promote
    assert max(p) < 0.002


def test_stochastic_rounding_is_reproducible():
    a = experiments.run("stochastic_rounding", quick=True)
    b = experiments.run("stochastic_rounding", quick=True)
    assert np.array_equal(a.data["losses"]["bf16 sr"], b.data["losses"]["bf16 sr"])


def test_block_formats_table_and_nvfp4_training(quick):
    r = experiments.run("block_formats", quick=True)
    sq = r.numbers["sqnr_db"]
    # three mantissa bits (e4m3, e2m3) > two (e3m2) > one (every 4-bit preset)
    four = max(v for k, v in sq.items() if "fp4" in k)
    assert min(sq["mxfp8"], sq["mxfp6-e2m3"]) > sq["mxfp6-e3m2"] > four > min(
        v for k, v in sq.items() if "fp4" in k) > 10
    assert r.numbers["clipped_blocks"]["mxfp8-te"] == 0 == r.numbers["clipped_blocks"]["nvfp4"]
    final = r.numbers["final_loss"]
    assert set(final) == {"fp32", "bf16 (no fp4/fp8)", "MXFP8BlockScaling",
                          "NVFP4BlockScaling", "NVFP4, head in bf16"}
    assert all(np.isfinite(v) and v < 3.5 for v in final.values())
    assert final["NVFP4BlockScaling"] != final["bf16 (no fp4/fp8)"]
    with pytest.raises(ValueError, match="multiples of 16"):
        experiments.run("block_formats", quick=True, seq=6)
    with pytest.raises(ValueError, match="weight must be one of"):
        experiments.run("block_formats", quick=True, weight="emb")


def test_collectives_errors_fp16_overflow_and_fp8_flush(quick):
    """One addition is one rounding (2 ranks: the ring is the exact sum
    rounded once); NVLS and the fp32 reduction equal the once-rounded sum
    where the fp32 sums are exact; the ring's error grows with the world and
    exceeds the tree's; pre-divided fp16 never overflows; the e4m3 flush
    count against ml_dtypes' cast."""
    import ml_dtypes
    from fpemu.experiments import collectives as exp
    r = quick["collectives"]
    e = r.numbers["median_ulp_error"]
    once = e["exact, rounded once"]
    assert e["NCCL ring"][0] == e["gloo ring"][0] == once[0]
    assert max(once) <= 0.5
    assert r.numbers["fp32_reduce_exact_at_every_world"]
    assert e["NVLS (fp32 in the switch)"] == once == e["fp32 reduce (ring), then bf16"]
    assert e["NCCL ring"][-1] > e["NCCL ring"][1] > 0 and e["NCCL tree"][-1] < e["NCCL ring"][-1]
    assert not any(r.numbers["fp16_overflow_fraction"]["fp16 avg (pre-divided)"])
    assert r.numbers["fp16_overflow_fraction"]["fp16 sum"][-1] > 0
    c = exp.Config(**exp.QUICK)
    X = exp._gradients(np.random.default_rng(c.seed), 2 ** c.max_world_log2, c.elements)
    flushed = (X.astype(ml_dtypes.float8_e4m3fn).astype(np.float32) == 0) & (X != 0)
    assert r.numbers["fp8"]["e4m3, no scale"]["zero_fraction"] == float(np.mean(flushed))


def test_emulated_training_trains_a_gpt_under_every_recipe(quick):
    """Every recipe's loss falls from the first step's and stays finite, and
    the curves are as long as the run (the values depend on the CPU's matmul
    order, so no loss is asserted exactly)."""
    r = quick["emulated_training"]
    assert r.numbers["all_recipes_trained"] and all(r.numbers["all_finite"].values())
    assert set(r.data["curves"]) == {"fp32", "bf16", "mxfp8", "nvfp4"}
    assert all(len(v) == r.config.steps for v in r.data["curves"].values())
    assert abs(r.numbers["relative_gap_to_fp32"]["bf16"]) < 0.05
