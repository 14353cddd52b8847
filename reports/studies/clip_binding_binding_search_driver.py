"""Probe driver: one BindingModel per probe (stage code unchanged), seed 0, split from generator seed 0.
usage: python driver.py OUT.jsonl 'JSON list of probes'
probe keys: v, frac, steps, d_model, n_heads, n_layers, d_ff, d_out, batch_size, lr, weight_decay, warmup,
            curve_every, flat_stop (stop when step>=flat_stop and max strict curve so far < 0.05), cpu_cap (s)
"""
import json, sys, time, os
import torch, lightning as L
from stages.clip_binding.train import Config, model_kwargs, build_model
from stages.clip_binding.scenes import World, split_objects
from stages.clip_binding.models import steps_loader
from stages.common.trainer import make_trainer
torch.set_num_threads(1)

BASE = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "d_out": 32, "batch_size": 64, "lr": 0.003,
        "weight_decay": 0.1, "warmup": 0.1, "steps": 1500, "curve_every": 250, "curve_scenes": 256}


class Watch(L.Callback):
    def __init__(self, flat_stop, cpu_cap, t0):
        self.flat_stop, self.cpu_cap, self.t0, self.n = flat_stop, cpu_cap, t0, 0
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        h = [r for r in pl_module.history if "seen_recomb_acc" in r]
        if len(h) > self.n:
            self.n = len(h)
            h[-1]["cpu"] = time.process_time() - self.t0
            print(f"  step {h[-1]['step']:5d} cpu {h[-1]['cpu']:6.1f} loss {h[-1]['loss']:.3f} "
                  f"pooled {h[-1]['seen_binding_acc']:.3f} strict {h[-1]['seen_recomb_acc']:.3f}", flush=True)
        cpu = time.process_time() - self.t0
        if self.flat_stop and batch_idx >= self.flat_stop and h and max(r["seen_recomb_acc"] for r in h) < 0.05:
            trainer.should_stop = True; pl_module.stopped = f"flat@{batch_idx}"
        if self.cpu_cap and cpu > self.cpu_cap:
            trainer.should_stop = True; pl_module.stopped = f"cpu@{batch_idx}"


def run(p):
    probe = dict(p); p = dict(p)
    v, frac = p.pop("v"), p.pop("frac")
    flat_stop, cpu_cap = p.pop("flat_stop", 0), p.pop("cpu_cap", 0)
    cfg = Config.model_validate({**BASE, **p, "trainer": {"enable_progress_bar": False}})
    world = World(2, v, 2)
    train_objs = torch.arange(world.n_objects)[split_objects(world, frac, torch.Generator().manual_seed(0))]
    model = build_model(world, train_objs, model_kwargs(cfg, world), 0, "torch")
    model.stopped = ""
    t0 = time.process_time(); w0 = time.time()
    trainer = make_trainer(cfg.trainer, None, max_steps=cfg.steps)
    trainer.callbacks.append(Watch(flat_stop, cpu_cap, t0))
    trainer.fit(model, steps_loader(cfg.steps))
    cpu = time.process_time() - t0
    h = [r for r in model.history if "seen_recomb_acc" in r]
    last = model.history[-1]
    with torch.no_grad():   # diagnostic: additive R2 of the probe's object code on the training objects
        from stages.clip_binding.complexity import additive_code_r2
        model = model.cpu().eval()
        r2 = additive_code_r2(model.embed_objects(train_objs).double().numpy(), world.concepts(train_objs).numpy(), v, 1e-3)
    return {"probe": probe, "v": v, "frac": frac, "n_train": len(train_objs), **{k: getattr(cfg, k) for k in BASE},
            "steps_done": last["step"] + 1, "stopped": model.stopped, "cpu_s": round(cpu, 1),
            "wall_s": round(time.time() - w0, 1), "final_loss": round(last["loss"], 3), "probe_add_r2": round(r2, 4),
            "curve_steps": [r["step"] for r in h], "pooled": [round(r["seen_binding_acc"], 3) for r in h],
            "strict": [round(r["seen_recomb_acc"], 3) for r in h], "curve_cpu": [round(r["cpu"], 1) for r in h if "cpu" in r]}


if __name__ == "__main__":
    out = sys.argv[1]
    for p in json.loads(sys.argv[2]):
        print("PROBE", json.dumps(p), flush=True)
        r = run(p)
        print("RESULT", json.dumps(r), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(r) + "\n")
