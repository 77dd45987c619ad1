# nnwizard-expect: train-mode-missing
# nnwizard-symptom: auto
"""A character-level GRU language model trained on one long token stream cut into bptt-long slices
by a loop over range() (no DataLoader), in the style of pytorch/examples' word_language_model:
argparse, batchify(), get_batch(), train() and evaluate(). Planted fault: train() never calls
model.train(), so after the first evaluate() (model.eval()) every later epoch trains with dropout
off. The first epoch has about 100 slices, more than a bounded run's 60 steps: only a capped slice loop
lets the run reach evaluate() and the second epoch."""

import argparse
import math

import torch
import torch.nn as nn

WORDS = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "log", "and", "then", "slept", "far", "away"]


def corpus(n_words, seed):
    """A token stream of pseudo-sentences over a small alphabet (ids of characters)."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (n_words,), generator=g).tolist()
    text = " ".join(WORDS[i] for i in picks) + " ."
    alphabet = sorted(set(text))
    return torch.tensor([alphabet.index(c) for c in text]), len(alphabet)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()   # (time, batch)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


class CharGRU(nn.Module):
    def __init__(self, ntoken, emsize=16, nhid=48, dropout=0.3):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, emsize)
        self.rnn = nn.GRU(emsize, nhid)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)), hidden

    def init_hidden(self, bsz):
        return torch.zeros(1, bsz, self.nhid)


def evaluate(model, criterion, source, bptt, ntokens):
    model.eval()
    total = 0.0
    hidden = model.init_hidden(source.size(1))
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, bptt):
            data, targets = get_batch(source, i, bptt)
            output, hidden = model(data, hidden)
            total += len(data) * criterion(output.view(-1, ntokens), targets).item()
    return total / (len(source) - 1)


def train(model, criterion, optimizer, source, bptt, ntokens, epoch, log_interval):
    # PLANTED: no model.train() here, and evaluate() leaves the model in eval mode
    hidden = model.init_hidden(source.size(1))
    for batch, i in enumerate(range(0, source.size(0) - 1, bptt)):
        data, targets = get_batch(source, i, bptt)
        hidden = hidden.detach()
        optimizer.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, ntokens), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        if batch % log_interval == 0:
            print(f"| epoch {epoch} | batch {batch} | loss {loss.item():.3f}")


def main():
    parser = argparse.ArgumentParser(description="character-level GRU language model")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--bptt", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    tokens, ntokens = corpus(8000, seed=args.seed)
    split = int(0.9 * len(tokens))
    train_data = batchify(tokens[:split], args.batch_size)
    val_data = batchify(tokens[split:], 8)

    model = CharGRU(ntokens)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        train(model, criterion, optimizer, train_data, args.bptt, ntokens, epoch, args.log_interval)
        val_loss = evaluate(model, criterion, val_data, args.bptt, ntokens)
        print(f"| end of epoch {epoch} | valid loss {val_loss:.3f} | valid ppl {math.exp(val_loss):.2f}")


if __name__ == "__main__":
    main()
