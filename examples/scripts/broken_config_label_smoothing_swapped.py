# nnwizard-expect: loss-output-mismatch
# nnwizard-symptom: flat
# A config-dict script with its own label-smoothing cross-entropy (written before nn.CrossEntropyLoss had
# label_smoothing), sklearn digits, an MLP, Adam.
# Planted fault: the two weights of the smoothed loss are swapped, so 90% of the loss pulls every class
# towards the same probability and only 10% towards the label: the loss cannot fall far below its start,
# even on one batch, at any learning rate. Nothing in the recording looks wrong; the script ladder's loss
# rung (the standard loss on the same outputs and labels) is what learns.
import torch
from torch import nn
from sklearn.datasets import load_digits

CONFIG = {"hidden": 64, "lr": 3e-3, "epochs": 6, "batch_size": 64, "smoothing": 0.1, "seed": 0}


def smoothed_cross_entropy(logits, target, eps):
    logp = logits.log_softmax(dim=1)
    nll = -logp.gather(1, target[:, None]).squeeze(1)
    uniform = -logp.mean(dim=1)
    return (eps * nll + (1 - eps) * uniform).mean()   # PLANTED: should be (1 - eps) * nll + eps * uniform


def main(cfg):
    torch.manual_seed(cfg["seed"])
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    train = torch.utils.data.TensorDataset(x[:1400], y[:1400])
    loader = torch.utils.data.DataLoader(train, batch_size=cfg["batch_size"], shuffle=True)
    model = nn.Sequential(nn.Linear(64, cfg["hidden"]), nn.ReLU(), nn.Linear(cfg["hidden"], 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    for epoch in range(cfg["epochs"]):
        model.train()
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = smoothed_cross_entropy(model(xb), yb, cfg["smoothing"])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(xb)
        model.eval()
        with torch.no_grad():
            acc = (model(x[1400:]).argmax(1) == y[1400:]).float().mean().item()
        print(f"epoch {epoch}: loss {total / len(train):.4f}  val acc {acc:.3f}")


if __name__ == "__main__":
    main(CONFIG)
