"""Lightning's strategy "bagua": 2 CPU processes fit a small model (skips without Lightning)."""

import os
import subprocess
import sys

import pytest

import harness

lightning = pytest.importorskip(
    "lightning", reason="Lightning is not installed (not in Debian); this test runs on the GPU "
                        "machine's /opt/torch/.venv")

SCRIPT = r'''
import os, sys, torch
import lightning.pytorch as pl
import bagua.lightning  # registers "bagua"
from bagua.lightning import BaguaStrategy

class Boring(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)
    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.layer.parameters(), lr=0.1)
    def train_dataloader(self):
        torch.manual_seed(13)
        return torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=2)

pl.seed_everything(13)
model = Boring()
algo = sys.argv[1]
accel = sys.argv[2]
strategy = "bagua" if algo == "default" else BaguaStrategy(algorithm=algo)
trainer = pl.Trainer(max_epochs=1, strategy=strategy, accelerator=accel, devices=2,
                     enable_progress_bar=False, logger=False, enable_checkpointing=False)
trainer.fit(model)
w = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
print("NORM", trainer.global_rank, float(w.norm()))
'''


# auto: 16 steps a rank, past its probe (8 steps) into its choice.
@pytest.mark.parametrize("algo", ["default", "bytegrad", "auto"])
def test_lightning_strategy(tmp_path, algo):
    accel = os.environ.get("BAGUA_TEST_ACCELERATOR", "cpu")
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(harness.free_port()))
    p = subprocess.run([sys.executable, str(script), algo, accel], env=env, cwd=str(tmp_path),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out[-4000:]
    norms = [l for l in out.splitlines() if l.startswith("NORM")]
    assert norms, out[-4000:]
