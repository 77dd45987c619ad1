"""A Hugging Face ``Trainer.train`` run: a tiny GPT-2 built from a config (no downloads) learning a
synthetic language of repeating patterns.

    python examples/watch/hf_train.py
    python examples/watch/hf_train.py --watch nnwizard-watch     # with nnwizard's TrainerCallback
    nnwizard watch --script examples/watch/hf_train.py            # watched with no code change
"""

import argparse
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Patterns(torch.utils.data.Dataset):
    def __init__(self, n=512, length=32, vocab=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab, (n, 1), generator=g)
        steps = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (starts + steps * torch.arange(length)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--watch", default=None, help="add nnwizard's WatchCallback writing to this folder")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    callbacks = []
    if args.watch:
        from nnwizard.integrations.transformers import WatchCallback

        callbacks.append(WatchCallback(out=args.watch))
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, max_steps=args.steps, per_device_train_batch_size=16,
                                     learning_rate=args.lr, logging_steps=20, save_strategy="no", report_to=[],
                                     use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
        trainer = Trainer(model=model, args=training, train_dataset=Patterns(), callbacks=callbacks)
        result = trainer.train()
    print(f"trained {result.global_step} steps, mean loss {result.training_loss:.4f}")


if __name__ == "__main__":
    main()
