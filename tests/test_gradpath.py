"""grad-path: one backward followed op by op from the loss to every trained parameter. Each way the gradient
dies (cut by a round trip through Python numbers, a detach, a no_grad block; zero at a softmax over one
unit, a dead ReLU, a round; an output that ignores the input) is found and named with its line, in module
mode and in script mode; healthy steps, and exits from the graph that the loss does not need (logging,
metrics), stay quiet."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnwizard.probes._gradwalk import GradWalk, constant_rows
from nnwizard.probes.api import ProbeContext, load_all
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget
from nnwizard.target import load_target

PROBES = load_all()
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HERE = Path(__file__).resolve()


def _walk(step, model: nn.Module) -> dict:
    walk = GradWalk(files=[HERE])
    with walk:
        walk.attach(model)
        loss = step(model)
        walk.watch(loss)
        loss.backward()
    return walk.report({id(p): n for n, p in model.named_parameters()})


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


X, Y = torch.randn(16, 8), torch.randn(16, 1)


def test_a_healthy_step_reaches_every_parameter_with_a_nonzero_gradient():
    found = _walk(lambda m: F.mse_loss(m(X), Y), _mlp())
    assert found["reached"] == 4 and not found["unreached"] and not found["zero"], found


def test_a_round_trip_through_python_numbers_is_cut_at_item_and_restarts_at_torch_tensor():
    def step(m):
        out = m(X)
        return F.mse_loss(torch.tensor([[o.item()] for o in out], requires_grad=True), Y)

    found = _walk(step, _mlp())
    assert found["reached"] == 0 and len(found["unreached"]) == 4
    assert found["exit"]["op"] == "item" and found["exit"]["count"] == 16
    assert "test_gradpath.py" in found["exit"]["where"]
    assert found["restart"].op == "tensor"


@pytest.mark.parametrize("cut, op", [("detach", "detach"), ("no_grad", "linear")])
def test_a_detach_or_a_no_grad_block_cuts_the_layers_before_it(cut, op):
    def step(m):
        if cut == "detach":
            h = m[0](X).detach()
        else:
            with torch.no_grad():
                h = m[0](X)
        return F.mse_loss(m[2](m[1](h)), Y)

    found = _walk(step, _mlp())
    assert sorted(found["unreached"]) == ["0.bias", "0.weight"], found
    assert found["exit"]["op"] == op


def test_a_softmax_over_one_output_unit_makes_every_gradient_exactly_zero():
    found = _walk(lambda m: F.binary_cross_entropy(F.softmax(m(X), dim=1), (Y > 0).float()), _mlp())
    assert len(found["zero"]) == 4
    node = found["zero_node"]
    assert node["cause"] == "softmax-size1" and node["dim_size"] == 1 and node["saved_min"] == node["saved_max"] == 1.0


def test_a_softmax_over_the_last_dimension_is_walked_through():
    """Autograd saves ``dim=-1`` as an unsigned number (2**64 - 1): the walk reads it as -1 and goes on to every
    parameter behind the softmax (an attention layer's), instead of stopping there and calling them unreached."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    found = _walk(lambda m: F.nll_loss(torch.log(torch.softmax(m(X), dim=-1)), (Y[:, 0] > 0).long()), model)
    assert found["reached"] == found["trained"] == 4 and not found["unreached"] and not found.get("unread"), found


def test_a_dead_relu_and_a_round_are_named():
    model = _mlp()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)
    dead = _walk(lambda m: F.mse_loss(m(X), Y), model)
    assert dead["zero_node"]["cause"] == "relu-dead" and dead["zero_node"]["module"] == "1"
    rounded = _walk(lambda m: F.mse_loss(torch.round(m(X)), Y), _mlp())
    assert rounded["zero_node"]["cause"] == "step-function" and rounded["zero_node"]["op"] == "round"


def test_exits_the_loss_does_not_need_are_not_blamed():
    def step(m):
        out = m(X)
        _ = out.argmax(1).tolist(), float(out.mean()), out.detach().numpy()   # metrics and logging
        return F.mse_loss(out, Y)

    found = _walk(step, _mlp())
    assert not found["unreached"] and "exit" not in found


def test_constant_rows_needs_differing_inputs():
    same = torch.ones(8, 3)
    assert constant_rows(same, torch.randn(8, 5))["rows"] == 8
    assert constant_rows(same, torch.ones(8, 5)) is None   # the inputs are the same too
    assert constant_rows(torch.randn(8, 3), torch.randn(8, 5)) is None


# ------------------------------------------------------------------------------------ module mode
@pytest.mark.parametrize("name, outcome, cause", [
    ("broken_loss_through_python_numbers", "cut", "cut"),
    ("broken_predictions_rounded", "zero", "step-function"),
    ("broken_softmax_size1", "zero", "softmax-size1"),
    ("broken_output_ignores_input", "constant-output", "constant-output"),
    ("healthy_rounded_metric", "ok", None),
    ("healthy_mlp", "ok", None),
])
def test_module_examples(name, outcome, cause):
    target = load_target(str(EXAMPLES / f"{name}.py"), "cpu")
    result = PROBES["grad-path"](ProbeContext(target, params={}))
    assert result.outcome == outcome, result.summary
    if cause:
        assert result.data["cause"] == cause, result.summary
    if cause not in (None, "constant-output"):
        assert f"{name}.py:" in result.data["where"], result.summary


def test_a_head_initialised_at_zero_gives_constant_rows_from_its_input_and_is_not_flagged(tmp_path):
    path = tmp_path / "zero_head.py"
    path.write_text("import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n"
                    "g = torch.Generator().manual_seed(0)\nx, y = torch.randn(256, 8, generator=g), torch.randn(256, 1, generator=g)\n"
                    "def build_model():\n    m = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))\n"
                    "    nn.init.zeros_(m[2].weight)\n    nn.init.zeros_(m[2].bias)\n    return m\n"
                    "def build_data():\n    return TensorDataset(x[:200], y[:200]), TensorDataset(x[200:], y[200:])\n"
                    "loss_fn = nn.MSELoss()\n", encoding="utf-8")
    result = PROBES["grad-path"](ProbeContext(load_target(str(path), "cpu"), params={}))
    assert result.status == "passed", result.summary   # (every row is 0 at the first step, computed from the input)


def test_a_zero_initialised_layer_is_not_a_fault():
    class ZeroHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 16)
            self.head = nn.Linear(16, 1)
            nn.init.zeros_(self.head.weight)

        def forward(self, x):
            return self.head(torch.tanh(self.body(x)))

    found = _walk(lambda m: F.mse_loss(m(X), Y), ZeroHead())
    assert found["zero_node"]["cause"] == "scaled-by-zero" or found["zero_node"]["cause"] == "zero-op"


# ------------------------------------------------------------------------------------ script mode
SCRIPT = '''
import torch
from torch import nn
torch.manual_seed(0)
x, y = torch.randn(256, 6), (torch.rand(256, 1) > 0.5).float()
net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(net.parameters(), lr=1e-2)
for epoch in range(3):
    for i in range(0, 256, 32):
        out = net(x[i:i + 32])
        loss = {LOSS}
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def _script(tmp_path: Path, loss: str):
    path = tmp_path / "fit.py"
    path.write_text(SCRIPT.replace("{LOSS}", loss), encoding="utf-8")
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=10)))
    return PROBES["grad-path"](ProbeContext(target, params={}))


def test_script_softmax_over_one_unit_is_followed_to_its_line(tmp_path):
    result = _script(tmp_path, "nn.functional.binary_cross_entropy(torch.softmax(out, dim=1), y[i:i + 32])")
    assert result.outcome == "zero" and result.data["cause"] == "softmax-size1", result.summary
    assert result.data["where"].startswith("fit.py:11"), result.data["where"]   # the softmax's line
    assert "gradient norm was exactly 0" in result.data["why"]


def test_a_softmax_inside_the_loss_function_is_named_at_the_loss_call(tmp_path):
    """cross_entropy over one output unit (a class-score loss on a regression head): the log_softmax is made inside
    torch's cross_entropy, which the recorder's loss wrapper calls for the script; the line named is the script's."""
    result = _script(tmp_path, "nn.functional.cross_entropy(out, y[i:i + 32])")
    assert result.outcome == "zero" and result.data["cause"] == "softmax-size1", result.summary
    assert result.data["op"] == "LogSoftmax inside cross_entropy", result.data["op"]
    assert result.data["where"].startswith("fit.py:11"), result.data["where"]


def test_script_loss_rebuilt_from_a_number(tmp_path):
    result = _script(tmp_path, "torch.tensor(nn.functional.binary_cross_entropy_with_logits(out, y[i:i + 32]).item(), "
                               "requires_grad=True)")
    assert result.outcome == "cut" and result.data["op"] == "item", result.summary
    assert result.data["restart_op"] == "tensor"


def test_script_healthy_loop_makes_no_rerun(tmp_path):
    result = _script(tmp_path, "nn.functional.binary_cross_entropy_with_logits(out, y[i:i + 32])")
    assert result.outcome == "not-needed", result.summary


def test_torch_tensor_of_a_list_of_tensors_is_a_round_trip_with_the_fix_stack():
    from nnwizard.probes._crash import classify_exception

    model = nn.Linear(4, 3)
    with torch.enable_grad():   # (whatever grad mode an earlier test left behind)
        scores = [model(torch.randn(5, 4))[:, k] for k in range(3)]
    try:
        torch.tensor(scores)
    except ValueError as exc:
        found = classify_exception(exc, model=model, files=[HERE])
    assert found.hypothesis == "disconnected-parameters" and found.subject == "scores"
    assert "torch.stack(scores)" in found.sentence
    data = [torch.randn(4) for _ in range(3)]
    try:
        torch.tensor(data)
    except ValueError as exc:
        plain = classify_exception(exc, files=[HERE])
    assert plain.hypothesis == "op-shape-mismatch" and "torch.stack(data)" in plain.sentence
