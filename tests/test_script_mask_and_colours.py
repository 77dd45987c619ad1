"""Script mode: a float attention mask of 0 and -inf passed to the model (nn.Transformer's
generate_square_subsequent_mask) is not a non-finite input; -inf in the data itself still is. Terminal colour codes (torch puts some in its own messages) stay out of the recorded error and printed lines."""

from __future__ import annotations

import pytest

from nnwizard.probes.api import ProbeContext, load_all
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

PROBES = load_all()

SCRIPT = '''
import torch
from torch import nn
torch.manual_seed(0)

class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, seq, bias):
        h = self.inp(seq)
        weights = torch.softmax(h @ h.transpose(1, 2) + bias, dim=-1)
        return self.out(weights @ h).squeeze(-1)

T = 6
bias = torch.full((T, T), float("-inf")).triu(1)        # 0 on and below the diagonal
model = Scorer()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(5):
    seq = torch.rand(4, T, 3) + 0.1
    seq = {FEATURES}
    loss = nn.functional.mse_loss(model(seq, bias), seq.sum(-1).clamp(max=2.0))
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


@pytest.mark.parametrize("features,nonfinite", [
    ("seq", False),
    ("seq.masked_fill(seq > 1.0, float('-inf'))", True),      # -inf in the data (a log of zero counts)
])
def test_an_additive_mask_is_not_a_non_finite_input(tmp_path, features, nonfinite):
    path = tmp_path / "attn.py"
    path.write_text(SCRIPT.replace("{FEATURES}", features), encoding="utf-8")
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=5)))
    assert any(s.nonfinite_input for s in target.recording.steps) is nonfinite


def test_terminal_colour_codes_leave_the_recorded_error_and_printed_lines(tmp_path):
    path = tmp_path / "coloured.py"
    path.write_text('print("\\x1b[32mepoch 1\\x1b[0m done")\nraise RuntimeError("load \\x1b[1monly if trusted\\x1b[0m")\n',
                    encoding="utf-8")
    run = run_script(load_script(str(path)), [], RunOptions(max_steps=2))
    assert run.recording.error.message == "load only if trusted"
    assert any(line.endswith("epoch 1 done") for line in run.output), run.output
