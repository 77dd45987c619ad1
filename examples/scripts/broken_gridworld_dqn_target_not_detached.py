# nnwizard-expect: target-not-detached
# nnwizard-symptom: auto
"""Broken: Q-learning on a small grid world (an epsilon-greedy actor, a replay buffer, a target network
synced every few updates, Huber loss, clipping) whose learner computes the TD target from the online
network with gradient tracking on: every update also moves the target it regresses to."""

import argparse
import random

import torch
import torch.nn.functional as F
from torch import nn

SIZE = 5           # a SIZE x SIZE grid; start at the top-left, the goal at the bottom-right
MOVES = [(0, 1), (1, 0), (0, -1), (-1, 0)]


class Grid:
    def reset(self):
        self.pos, self.t = (0, 0), 0
        return self.observe()

    def observe(self):
        board = torch.zeros(2, SIZE, SIZE)
        board[0, self.pos[0], self.pos[1]] = 1.0
        board[1, SIZE - 1, SIZE - 1] = 1.0
        return board.flatten()

    def step(self, action):
        dr, dc = MOVES[action]
        self.pos = (min(max(self.pos[0] + dr, 0), SIZE - 1), min(max(self.pos[1] + dc, 0), SIZE - 1))
        self.t += 1
        done = self.pos == (SIZE - 1, SIZE - 1)
        return self.observe(), (1.0 if done else -0.04), done or self.t >= 4 * SIZE


def q_network():
    return nn.Sequential(nn.Linear(2 * SIZE * SIZE, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, len(MOVES)))


def act(q_net, obs, epsilon):
    if random.random() < epsilon:
        return random.randrange(len(MOVES))
    with torch.no_grad():
        return int(q_net(obs.unsqueeze(0)).argmax(1))


def learn(q_net, target_net, optimizer, batch, gamma):
    obs, actions, rewards, next_obs, done = batch
    q = q_net(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
    target = rewards + gamma * (1.0 - done) * q_net(next_obs).max(1).values   # the target network, and no_grad, forgotten
    loss = F.smooth_l1_loss(q, target)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q_net.parameters(), 10.0)
    optimizer.step()
    return loss.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--sync-every", type=int, default=50)
    args = parser.parse_args()
    random.seed(0)
    torch.manual_seed(0)

    env, memory = Grid(), []
    q_net, target_net = q_network(), q_network()
    target_net.load_state_dict(q_net.state_dict())
    target_net.eval()
    optimizer = torch.optim.Adam(q_net.parameters(), lr=args.lr)
    updates, losses = 0, []
    for episode in range(args.episodes):
        obs, done, steps = env.reset(), False, 0
        epsilon = max(0.05, 1.0 - episode / (0.5 * args.episodes))
        while not done:
            action = act(q_net, obs, epsilon)
            next_obs, reward, done = env.step(action)
            memory.append((obs, action, reward, next_obs, float(done)))
            del memory[:-5000]   # the oldest transitions out
            obs, steps = next_obs, steps + 1
            if len(memory) >= args.batch_size:
                sample = random.sample(memory, args.batch_size)
                batch = (torch.stack([s[0] for s in sample]), torch.tensor([s[1] for s in sample]),
                         torch.tensor([s[2] for s in sample]), torch.stack([s[3] for s in sample]),
                         torch.tensor([s[4] for s in sample]))
                losses.append(learn(q_net, target_net, optimizer, batch, args.gamma))
                updates += 1
                if updates % args.sync_every == 0:
                    target_net.load_state_dict(q_net.state_dict())
        if episode % 25 == 0 and losses:
            print(f"episode {episode}: {steps} steps, epsilon {epsilon:.2f}, "
                  f"TD loss {sum(losses[-50:]) / len(losses[-50:]):.4f}")


if __name__ == "__main__":
    main()
