# nnwizard-expect:
# nnwizard-symptom: auto
# Healthy: a per-step tagger in PyTorch's default time-first layout. A GRU (batch_first=False) reads
# (T, B, F) sequences and a linear head scores every step, giving (T, B, C). The targets are kept
# time-first too, so logits.view(-1, C) and tags.view(-1) line up row for row. The task: tag each
# step with the sign pattern of the current and the previous input (4 classes).
import torch
from torch import nn
import torch.nn.functional as F


class Tagger(nn.Module):
    def __init__(self, features=6, hidden=32, classes=4):
        super().__init__()
        self.gru = nn.GRU(features, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):                 # x: (T, B, F)
        states, _ = self.gru(x)
        return self.head(states)          # (T, B, C)


def make_data(n, steps, gen):
    x = torch.randn(steps, n, 6, generator=gen)
    now = (x[:, :, 0] > 0).long()
    before = torch.cat([torch.zeros(1, n, dtype=torch.long), now[:-1]])
    return x, 2 * before + now            # tags: (T, B)


def main():
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x_train, y_train = make_data(1024, 12, gen)
    x_val, y_val = make_data(256, 12, gen)
    model = Tagger()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    batch = 32
    for epoch in range(4):
        model.train()
        order = torch.randperm(x_train.shape[1])
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            xb, yb = x_train[:, idx], y_train[:, idx]      # batch along dim 1
            logits = model(xb)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), yb.view(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_val).argmax(-1) == y_val).float().mean().item()
        print(f"epoch {epoch}: last loss {loss.item():.4f}  val accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
