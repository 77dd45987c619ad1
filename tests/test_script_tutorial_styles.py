"""Scripts in the styles of pytorch/tutorials' lessons. The NLP ones: one sentence per forward as a 1-D
tensor of token ids, laid out (time, 1, features) for a time-first LSTM by the model itself. Dim 0 is time
there, not a batch (batch-independence must stay quiet), while the same layout over a DataLoader batch of
independent samples still mixes them; a hidden state carried into the next step without being reset is a
graph kept across steps even though it is not the model's output. The char-RNN one: a recurrent cell
called once per character, updated by hand (p.data.add_(p.grad, alpha=-lr)): the update's sign is
audited, a parameter left without a gradient is named when the update raises on it, and a NaN hidden
state fed back is not NaN input data."""

from __future__ import annotations

import pytest

from nnwizard.probes.api import ProbeContext, get
from tests.test_script_mode import record, write

TAGGER = '''
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(1)
data = [("the dog ate the apple".split(), [0, 1, 2, 0, 1]), ("everybody read that book".split(), [1, 2, 0, 1]),
        ("a cat saw the dog".split(), [0, 1, 2, 0, 1])]
vocab = {w: i for i, w in enumerate(sorted({w for s, _ in data for w in s}))}


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(len(vocab), 6)
        self.lstm = nn.LSTM(6, 6)
        self.out = nn.Linear(6, 3)
        self.hidden = self.init_hidden()

    def init_hidden(self):
        return (torch.zeros(1, 1, 6), torch.zeros(1, 1, 6))

    def forward(self, sentence):
        h, self.hidden = self.lstm(self.emb(sentence).view(len(sentence), 1, -1), self.hidden)
        return F.log_softmax(self.out(h.view(len(sentence), -1)), dim=1)


model = Tagger()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
crit = nn.NLLLoss()
for epoch in range(20):
    for words, tags in data:
        model.zero_grad()
        model.hidden = model.init_hidden()
        x = torch.tensor([vocab[w] for w in words])
        loss = crit(model(x), torch.tensor(tags))
        loss.backward()
        opt.step()
'''

# a batch of independent samples laid out as one sequence: the samples really are mixed
SAMPLES_AS_SEQUENCE = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
X = torch.randn(256, 8)
Y = (X[:, 0] > 0).long()
loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16)
        self.out = nn.Linear(16, 2)

    def forward(self, x):
        h, _ = self.lstm(x.view(len(x), 1, -1))
        return self.out(h.view(len(x), -1))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
crit = nn.CrossEntropyLoss()
for epoch in range(3):
    for x, y in loader:
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
'''


def _run(target, probe_id):
    return get(probe_id)(ProbeContext(target))


def test_one_sentence_per_forward_is_not_a_batch(tmp_path):
    target = record(write(tmp_path, text=TAGGER))
    assert target.sequence_lengths is not None     # 5, 4, 5, ... tokens a forward
    result = _run(target, "batch-independence")
    assert (result.status, result.outcome) == ("skipped", "time-first"), result.summary
    assert _run(target, "trace-graph").status == "passed"


def test_samples_laid_out_as_one_sequence_still_mix(tmp_path):
    target = record(write(tmp_path, text=SAMPLES_AS_SEQUENCE))
    assert target.sequence_lengths is None          # a DataLoader batch as yielded
    result = _run(target, "batch-independence")
    assert (result.status, result.outcome) == ("failed", "sequence-axis"), result.summary


def test_hidden_state_not_reset_is_a_graph_across_steps(tmp_path):
    path = write(tmp_path, ("        model.hidden = model.init_hidden()\n", ""), text=TAGGER)
    target = record(path)
    assert target.crashed                           # backward through the first sentence's freed graph
    result = _run(target, "trace-graph")
    assert (result.status, result.outcome) == ("failed", "spans"), result.summary
    assert result.data["raised"] is True


@pytest.mark.parametrize("steps", [1])
def test_graph_audit_needs_two_steps(tmp_path, steps):
    target = record(write(tmp_path, text=TAGGER), max_steps=steps)
    assert _run(target, "trace-graph").status == "skipped"


def test_crf_scores_subtracted_the_wrong_way_round_are_unbounded(tmp_path):
    """A hand-written objective (no loss function): a linear-chain score whose gold path is pushed down
    and whose partition is pushed up, as a CRF with gold - forward does: below zero, ever faster."""
    text = TAGGER.replace("        loss = crit(model(x), torch.tensor(tags))\n",
                          "        scores = model(x)\n"
                          "        gold = scores[torch.arange(len(tags)), torch.tensor(tags)].sum()\n"
                          "        loss = gold - torch.logsumexp(scores * 3.0, dim=1).sum()\n")
    target = record(write(tmp_path, text=text), max_steps=40)
    result = _run(target, "trace-loss-sign")
    assert (result.status, result.outcome) == ("failed", "unbounded"), result.summary
    healthy = record(write(tmp_path, text=TAGGER, name="healthy.py"), max_steps=40)
    assert _run(healthy, "trace-loss-sign").status == "passed"


CHAR_RNN = '''
import torch
from torch import nn

torch.manual_seed(0)
letters = "abcdefgh"
names = {0: ["abca", "acab", "bacab", "abc"], 1: ["fgh", "hgfe", "efgh", "fhge"]}


def line_tensor(line):
    t = torch.zeros(len(line), 1, len(letters))
    for i, ch in enumerate(line):
        t[i, 0, letters.index(ch)] = 1
    return t


class RNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(len(letters) + 16, 16)
        self.i2o = nn.Linear(len(letters) + 16, 2)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, x, hidden):
        combined = torch.cat((x, hidden), 1)
        return self.softmax(self.i2o(combined)), torch.tanh(self.i2h(combined))


rnn = RNN()
crit = nn.NLLLoss()
for it in range(200):
    label = it % 2
    line = line_tensor(names[label][it // 2 % 4])
    hidden = torch.zeros(1, 16)
    rnn.zero_grad()
    for i in range(line.size(0)):
        output, hidden = rnn(line[i], hidden)
    loss = crit(output, torch.tensor([label]))
    loss.backward()
    for p in rnn.parameters():
        p.data.add_(p.grad.data, alpha=-0.05)
'''


def test_hand_written_update_that_climbs_the_gradient(tmp_path):
    climbing = record(write(tmp_path, ("alpha=-0.05", "alpha=0.05"), text=CHAR_RNN), max_steps=20)
    result = _run(climbing, "trace-loss-sign")
    assert (result.status, result.outcome) == ("failed", "ascent"), result.summary
    assert result.data["cos"] > 0.9
    descending = record(write(tmp_path, text=CHAR_RNN, name="descent.py"), max_steps=20)
    assert _run(descending, "trace-loss-sign").status == "passed"
    assert all(s.update_cos < -0.9 for s in descending.recording.steps if s.update_cos is not None)


def test_a_parameter_without_gradient_in_a_hand_written_update_is_disconnected(tmp_path):
    # the first letter's output scored: i2h never reaches the loss and p.grad.data raises on its None
    path = write(tmp_path, ("    loss = crit(output, torch.tensor([label]))",
                            "        outs = outs + [output] if i else [output]\n    loss = crit(outs[0], torch.tensor([label]))"),
                 text=CHAR_RNN)
    target = record(path, max_steps=20)
    assert target.crashed
    result = _run(target, "trace-crash")
    assert result.outcome == "disconnected-parameters", result.summary


def test_a_nan_hidden_state_fed_back_is_not_nan_input_data():
    import torch

    from nnwizard.record import nonfinite_inputs

    data = torch.zeros(1, 8)
    hidden = torch.full((1, 16), float("nan"), requires_grad=True) * 1.0   # computed by the graph
    assert not nonfinite_inputs([(data, hidden)])
    assert nonfinite_inputs([(torch.full((1, 8), float("nan")), torch.zeros(1, 16))])


VAE = '''
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
X = torch.rand(512, 16)
loader = DataLoader(TensorDataset(X), batch_size=64, shuffle=True)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(16, 32)
        self.mu, self.lv = nn.Linear(32, 4), nn.Linear(32, 4)
        self.dec = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x):
        h = F.relu(self.enc(x))
        mu, log_var = self.mu(h), self.lv(h)
        z = mu + torch.randn_like(mu) * torch.exp(log_var / 2)
        return torch.sigmoid(self.dec(z)), mu, log_var


model = VAE()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(20):
    for (x,) in loader:
        out, mu, log_var = model(x)
        rec = F.binary_cross_entropy(out, x, reduction="sum")
        kl = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())
        loss = rec + kl
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


@pytest.mark.parametrize("steps", [60, 300])
def test_vae_with_its_kl_sign_flipped_is_an_unbounded_objective(tmp_path, steps):
    """Over 300 steps the flipped KL runs into the float range (the gradient norm Inf, the loss stuck near
    -1e38): the curve is read up to there, not as a loss that levelled off."""
    flipped = record(write(tmp_path, ("kl = -0.5 * torch.sum", "kl = 0.5 * torch.sum"), text=VAE), max_steps=steps)
    result = _run(flipped, "trace-loss-sign")
    assert (result.status, result.outcome) == ("failed", "unbounded"), result.summary
    healthy = record(write(tmp_path, text=VAE, name="healthy.py"), max_steps=60)
    assert _run(healthy, "trace-loss-sign").status == "passed"


# Lightning Fabric's MNIST example style: the model ends in log_softmax and the loss is F.nll_loss
NLL = '''
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
X = torch.randn(512, 16)
Y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
loader = DataLoader(TensorDataset(X, Y), batch_size=64, shuffle=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 3)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


model = Net()
opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
for epoch in range(20):
    for x, y in loader:
        opt.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        opt.step()
'''


def test_nll_loss_on_raw_logits_is_its_input_not_a_flipped_sign(tmp_path):
    """Without log_softmax, nll_loss (-x[target]) falls below zero without bound; backward() still gets
    nll_loss's own value, so the sign is right: the input's form is the fault (trace-loss-input)."""
    raw = record(write(tmp_path, ("return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)",
                                  "return self.fc2(F.relu(self.fc1(x)))"), text=NLL), max_steps=60)
    assert min(st.loss for st in raw.recording.steps) < -5   # it did fall without bound
    assert _run(raw, "trace-loss-sign").status == "passed"
    assert _run(raw, "trace-loss-input").status == "failed"
    healthy = record(write(tmp_path, text=NLL, name="healthy.py"), max_steps=60)
    assert _run(healthy, "trace-loss-sign").status == "passed"
    assert _run(healthy, "trace-loss-input").status == "passed"

# pytorch/examples' GAT style: the mode only matters through F.dropout(training=self.training), no Dropout module
FUNCTIONAL_DROPOUT = '''
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(300, 12)
Y = (X[:, 0] > 0).long()
idx_train, idx_val = torch.arange(200), torch.arange(200, 300)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.randn(12, 32) * 0.2)
        self.out = nn.Linear(32, 2)

    def forward(self, x):
        h = F.dropout(F.elu(x @ self.W), 0.5, training=self.training)
        return F.log_softmax(self.out(h), dim=1)


def test(model, mask):
    model.eval()
    with torch.no_grad():
        return F.nll_loss(model(X)[mask], Y[mask]).item()


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(50):
    model.train()
    opt.zero_grad()
    loss = F.nll_loss(model(X)[idx_train], Y[idx_train])
    loss.backward()
    opt.step()
    test(model, idx_val)
'''


def test_a_forward_that_reads_self_training_makes_the_mode_matter(tmp_path):
    healthy = record(write(tmp_path, text=FUNCTIONAL_DROPOUT, name="healthy.py"))
    assert healthy.recording.models[0].reads_training == ["Net.forward"]
    assert _run(healthy, "trace-train-mode").outcome == "ok"
    assert _run(healthy, "trace-eval-mode").outcome == "ok"
    stays = record(write(tmp_path, ("    model.train()\n    opt.zero_grad()", "    opt.zero_grad()"), text=FUNCTIONAL_DROPOUT))
    result = _run(stays, "trace-train-mode")
    assert (result.status, result.outcome) == ("failed", "stays-eval"), result.summary
    assert "Net.forward" in result.summary
    no_eval = record(write(tmp_path, ("    model.eval()\n", ""), text=FUNCTIONAL_DROPOUT, name="noeval.py"))
    assert _run(no_eval, "trace-eval-mode").outcome == "train-mode-in-eval"
