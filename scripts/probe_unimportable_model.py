import torch, torch.nn as nn
def helper(x):
    return torch.relu(x) + 1
class Model(nn.Module):
    def __init__(self):
        super().__init__(); self.l = nn.Linear(16, 16)
    def forward(self, x):
        return helper(self.l(x))
