"""Script mode, next-token targets (probes/next_token.py): the relation between the model's input and
the loss targets, the counterfactual that tells a model that sees its own targets (no causal mask) from
one that does not, and the alignment of each loss row with its target; then both probes on recorded
scripts, each way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from nnwizard.probes.api import ProbeContext, load_all
from nnwizard.probes.mixing import SampleMixing
from nnwizard.probes.next_token import FirstForwards, future_dependence, shift_axis, target_position
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

PROBES = load_all()


def _stream(n: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ the relation
def test_targets_shifted_by_one_are_found_batch_first_and_time_first():
    s = _stream(400)
    rows = torch.stack([s[i:i + 17] for i in range(0, 160, 20)])          # (B=8, 17)
    x, y = rows[:, :-1], rows[:, 1:]
    assert shift_axis(x, y.reshape(-1))[:1] == (1,)
    assert shift_axis(x, y.reshape(-1))[2] == (0, 1)
    t_x, t_y = x.t().contiguous(), y.t().contiguous()                     # (T, B)
    assert shift_axis(t_x, t_y.reshape(-1))[0] == 0
    found = shift_axis(t_x, y.reshape(-1))                                 # batch-first targets, time-first input
    assert found[0] == 0 and found[2] == (1, 0)


def test_targets_that_are_no_shift_of_the_input_are_not_a_relation():
    x = _stream(160).view(8, 20)
    assert shift_axis(x, x.reshape(-1)) is None                           # a copy (an autoencoder)
    assert shift_axis(x, _stream(160, seed=1)) is None                    # unrelated labels
    assert shift_axis(x, torch.randint(0, 5, (8,))) is None               # one label per sample
    assert shift_axis(torch.zeros(8, 20, dtype=torch.long), torch.zeros(160, dtype=torch.long)) is None


def test_target_position_follows_the_targets_axis_order():
    assert target_position(5, [4, 3], (0, 1)) == (1, 2)
    assert target_position(5, [4, 3], (1, 0)) == (1, 1)                  # targets flattened as (3, 4)


# ------------------------------------------------------------------------------ the counterfactual
class TinyAttention(nn.Module):
    """One self-attention layer over token embeddings, batch-first, optionally causal."""

    def __init__(self, causal: bool, vocab: int = 50, width: int = 16):
        super().__init__()
        self.causal = causal
        self.emb = nn.Embedding(vocab, width)
        self.qkv = nn.Linear(width, 3 * width)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        h = self.emb(idx)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / 4.0
        if self.causal:
            t = idx.shape[1]
            scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
        return self.head(self.drop(scores.softmax(-1) @ v) + h)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_without_its_causal_mask_sees_the_future(causal):
    torch.manual_seed(0)
    x = _stream(160).view(8, 20)
    found = future_dependence(TinyAttention(causal), (x,), {}, 0, axis=1)
    assert found["judged"] and found["reached"]
    assert found["sees_future"] is (not causal), found


@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_time_first_rnn_sees_the_future_only_when_bidirectional(bidirectional):
    torch.manual_seed(0)

    class Lm(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 8)
            self.rnn = nn.GRU(8, 8, bidirectional=bidirectional)
            self.out = nn.Linear(16 if bidirectional else 8, 50)

        def forward(self, x, hidden=None):
            h, _ = self.rnn(self.emb(x), hidden)
            return self.out(h).view(-1, 50)                                # flattened inside, as many LMs do

    x = _stream(160).view(20, 8)
    model = Lm()
    found = future_dependence(model, (x,), {}, 0, axis=0)
    assert found["judged"] and found["reached"] and found["sees_future"] is bidirectional, found
    assert model.training                                                   # its mode is given back


# ------------------------------------------------------------------------------ recorded scripts
LM_SCRIPT = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
VOCAB, T, B = 40, 16, 8
stream = torch.randint(0, VOCAB, (4000,))

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.pos = nn.Parameter(torch.zeros(T, 32))
        self.att = nn.MultiheadAttention(32, 2, batch_first=True)
        self.out = nn.Linear(32, VOCAB)

    def forward(self, idx, causal=True):
        h = self.emb(idx) + self.pos[: idx.shape[1]]
        mask = torch.ones(idx.shape[1], idx.shape[1]).triu(1).bool() if causal else None
        a, _ = self.att(h, h, h, attn_mask=mask, need_weights=False)
        return self.out(h + a)

model = Block()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(6):
    starts = torch.randint(0, len(stream) - T - 1, (B,))
    xb = torch.stack([stream[s:s + T] for s in starts])
    yb = torch.stack([stream[s + 1:s + T + 1] for s in starts])
    logits = model(xb{CALL})
    loss = F.cross_entropy(logits.view(-1, VOCAB), yb.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
'''

TIME_FIRST_SCRIPT = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
VOCAB, T, B = 30, 12, 6
data = torch.randint(0, VOCAB, (2000,))
data = data[: len(data) // B * B].view(B, -1).t().contiguous()      # (steps, B), time-first

class Lm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.rnn = nn.LSTM(16, 16)
        self.dec = nn.Linear(16, VOCAB)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.dec(h)                                             # (T, B, V)

model = Lm()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for i in range(0, 6 * T, T):
    x, y = data[i:i + T], data[i + 1:i + 1 + T]
    out = model(x)
    out = {LOSS_INPUT}                                                 # the name rebound: the (T, B, V) output has no other
    loss = F.cross_entropy(out, {TARGET})
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def _recorded(tmp_path: Path, source: str):
    path = tmp_path / "train.py"
    path.write_text(source, encoding="utf-8")
    listeners = [SampleMixing(), FirstForwards()]
    try:
        run = run_script(load_script(str(path)), [], RunOptions(max_steps=4, listeners=listeners))
    finally:
        for listener in listeners:
            listener.close()
    return ScriptTarget(run)


def _probe(name: str, target):
    return PROBES[name](ProbeContext(target, params={}))


def test_a_recorded_lm_called_without_its_causal_mask_fails(tmp_path):
    target = _recorded(tmp_path, LM_SCRIPT.replace("{CALL}", ", causal=False"))
    result = _probe("trace-future-leak", target)
    assert result.outcome == "sees-future", result.summary
    assert "shifted by one along axis 1" in result.summary and "causal=" in result.summary
    assert not target.recording.models[0].module._forward_pre_hooks    # the listener's hook is gone


def test_the_same_lm_with_its_mask_passes(tmp_path):
    target = _recorded(tmp_path, LM_SCRIPT.replace("{CALL}", ""))
    result = _probe("trace-future-leak", target)
    assert result.status == "passed" and result.outcome == "ok", result.summary


def test_a_classifier_has_no_next_token_relation_and_is_skipped(tmp_path):
    source = LM_SCRIPT.replace("{CALL}", "").replace("yb.view(-1)", "xb.view(-1).flip(0)")
    result = _probe("trace-future-leak", _recorded(tmp_path, source))
    assert result.status == "skipped" and "not an input of the model shifted" in result.summary


@pytest.mark.parametrize("loss_input,targets,aligned", [
    ("out.view(-1, VOCAB)", "y.reshape(-1)", True),                             # both time-first
    ("out.transpose(0, 1).reshape(-1, VOCAB)", "y.t().reshape(-1)", True),      # both batch-first
    ("out.transpose(0, 1).reshape(-1, VOCAB)", "y.reshape(-1)", False),         # output batch-first, targets time-first
])
def test_loss_rows_are_checked_against_their_targets_position(tmp_path, loss_input, targets, aligned):
    source = TIME_FIRST_SCRIPT.replace("{LOSS_INPUT}", loss_input).replace("{TARGET}", targets)
    target = _recorded(tmp_path, source)
    result = _probe("trace-target-alignment", target)
    assert result.outcome == ("ok" if aligned else "misaligned"), result.summary
    assert _probe("trace-sample-mixing", target).outcome == "ok"    # no row mixes samples in any of them


TAGGER_SCRIPT = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
N, T, FEAT, TAGS = 96, 7, 4, 5
feats, tags = torch.randn(N, T, FEAT), torch.randint(0, TAGS, (N, T))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(feats, tags), batch_size=12)

class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(FEAT, 16, batch_first=True)
        self.out = nn.Linear(16, TAGS)

    def forward(self, x):
        return self.out(self.rnn(x)[0])                                 # (B, T, TAGS)

model = Tagger()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for x, y in loader:
    scores = model(x)
    loss = F.cross_entropy({LOSS_INPUT}, {TARGET})
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


@pytest.mark.parametrize("loss_input,targets,outcome", [
    ("scores.reshape(-1, TAGS)", "y.view(-1)", "ok"),
    ("scores.transpose(0, 1).reshape(-1, TAGS)", "y.t().contiguous().view(-1)", "ok"),   # both time-first
    ("scores.transpose(0, 1).reshape(-1, TAGS)", "y.view(-1)", "misaligned"),
    ("scores.transpose(0, 1).reshape(-1, TAGS)", "y.t().reshape(-1)", "skipped"),        # a copy: layout unknown
])
def test_a_tagger_is_checked_through_the_view_its_targets_are(tmp_path, loss_input, targets, outcome):
    source = TAGGER_SCRIPT.replace("{LOSS_INPUT}", loss_input).replace("{TARGET}", targets)
    result = _probe("trace-target-alignment", _recorded(tmp_path, source))
    assert result.outcome == outcome, result.summary


@pytest.mark.parametrize("targets,outcome", [("xb.view(-1)", "copies-input"), ("yb.view(-1)", "ok")])
def test_targets_that_are_the_input_itself_are_not_shifted(tmp_path, targets, outcome):
    source = LM_SCRIPT.replace("{CALL}", "").replace("yb.view(-1)", targets)
    assert _probe("trace-future-leak", _recorded(tmp_path, source)).outcome == outcome


def test_a_denoising_target_is_not_a_copy(tmp_path):
    corrupted = "model(xb.masked_fill(torch.rand(xb.shape) < 0.05, 0))"    # the input differs at some positions
    source = LM_SCRIPT.replace("{CALL}", "").replace("model(xb)", corrupted).replace("yb.view(-1)", "xb.view(-1)")
    assert _probe("trace-future-leak", _recorded(tmp_path, source)).outcome != "copies-input"


# words padded to one length: the model takes its targets and computes its own loss, padding left out with
# ignore_index=-1 (makemore's layout: x = [start, w...], y = [w..., end, -1, -1, ...])
WORDS_SCRIPT = '''
import random
import torch
from torch import nn
import torch.nn.functional as F
random.seed(0)
torch.manual_seed(0)
letters = "abcdefghij"
words = ["".join(random.choice(letters) for _ in range(random.randint(2, 6))) for _ in range(300)]
T = 8

def encode(word):
    ix = torch.tensor([letters.index(c) + 1 for c in word])
    x = torch.zeros(T, dtype=torch.long)
    y = torch.zeros(T, dtype=torch.long)
    x[1:1 + len(ix)] = ix
    {TARGETS}
    y[len(ix) + 1:] = -1
    return x, y

class Lm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 32)
        self.att = nn.MultiheadAttention(32, 2, batch_first=True)
        self.out = nn.Linear(32, 11)

    def forward(self, idx, targets=None):
        h = self.emb(idx)
        mask = torch.ones(T, T).triu(1).bool() if {CAUSAL} else None
        a, _ = self.att(h, h, h, attn_mask=mask, need_weights=False)
        logits = self.out(h + a)
        loss = F.cross_entropy(logits.view(-1, 11), targets.view(-1), ignore_index=-1)
        return logits, loss

model = Lm()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(6):
    X, Y = map(torch.stack, zip(*(encode(random.choice(words)) for _ in range(16))))
    logits, loss = model(X, Y)
    model.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
'''


@pytest.mark.parametrize("targets,causal,outcome", [
    ("y[:len(ix)] = ix", "True", "ok"),               # next-letter targets, masked attention
    ("y[:len(ix)] = ix", "False", "sees-future"),     # the mask forgotten
    ("y[1:1 + len(ix)] = ix", "True", "copies-input"),   # targets laid out as the input itself
    ("y[1:1 + len(ix)] = ix % 3 + 1", "True", "skipped"),  # a tag per letter: no relation (the model's own
])                                                         # second argument, the tags, is no input to copy)
def test_padded_targets_given_to_the_model_are_judged_on_the_positions_the_loss_counts(tmp_path, targets, causal, outcome):
    source = WORDS_SCRIPT.replace("{TARGETS}", targets).replace("{CAUSAL}", causal)
    target = _recorded(tmp_path, source)
    assert target.recording.loss_calls[0].target_arg == 1   # the model's second argument is the target itself
    result = _probe("trace-future-leak", target)
    assert result.outcome == outcome, result.summary
    if outcome in ("ok", "sees-future"):
        assert "argument 0" in result.summary and "ignore_index -1 left out" in result.summary


def test_misaligned_rows_are_found_where_evenly_spaced_rows_are_all_fixed_points_of_the_transpose(tmp_path):
    """(T, B) = (64, 8): flattening a (B, T) layout against a (T, B) one moves row r = t*B + b to b*T + t; its
    fixed points are the multiples of (B*T - 1) / 7 = 73, i.e. rows 0, 73, ..., 511: exactly eight evenly
    spaced rows from first to last. The checked rows must not be picked on such a grid."""
    source = (TIME_FIRST_SCRIPT.replace("VOCAB, T, B = 30, 12, 6", "VOCAB, T, B = 30, 64, 8")
              .replace("(2000,)", "(8000,)").replace("{LOSS_INPUT}", "out.transpose(0, 1).reshape(-1, VOCAB)")
              .replace("{TARGET}", "y.reshape(-1)"))
    target = _recorded(tmp_path, source)
    result = _probe("trace-target-alignment", target)
    assert result.outcome == "misaligned", result.summary
    assert _probe("trace-sample-mixing", target).outcome == "ok"
