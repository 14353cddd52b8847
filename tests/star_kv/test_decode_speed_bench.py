"""benchmarks/decode_speed.py: the table reads bench_rows' timings (small shapes here; the paper's are minutes of CPU)."""
from benchmarks import decode_speed
from kernels.lowrank_attention import bench_rows


def test_table_ratios_from_measured_rows():
    row = bench_rows("cpu", small=True, reps=1)[0]
    assert {"dense_sdpa_s", "materialize_sdpa_s", "latent_torch_s"} <= set(row) and "triton_s" not in row
    text = decode_speed.table(row)
    ratio = row["dense_sdpa_s"] / row["latent_torch_s"]
    assert f"| {ratio:.3g}x |" in text and "| 1x |" in text and "6.9x" in text and "no CUDA device" in text


def test_table_of_a_cuda_row_shows_the_kernel_and_roofline():
    row = {"case": "c", "device": "cuda", "dense_sdpa_s": 0.003, "materialize_sdpa_s": 0.006, "triton_s": 0.0005,
           "achieved_gbs": 2400.0, "bandwidth_fraction": 0.5}
    text = decode_speed.table(row)
    assert "| Triton kernel (latents only) | 0.5 | 6x |" in text and "50% of peak" in text


def test_reps_must_be_positive(capsys):
    import pytest
    with pytest.raises(SystemExit):
        decode_speed.main(["--reps", "0"])
    assert "--reps must be at least 1" in capsys.readouterr().err
