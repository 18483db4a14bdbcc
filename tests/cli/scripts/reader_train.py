"""A reader's train.py: an Accelerator loop on a tiny model (its layer class is BertLayer, as fsdp.yaml names)."""
import json, os, sys
import torch
from trainkit import Accelerator

class BertLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
    def forward(self, x):
        return torch.relu(self.linear(x))

def main():
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(BertLayer(), BertLayer(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 1)),
                                       batch_size=4)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for inputs, targets in data:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print("REPORT " + json.dumps({"rank": accelerator.process_index, "world": accelerator.num_processes,
                                  "distributed_type": str(accelerator.distributed_type.value),
                                  "mixed_precision": accelerator.mixed_precision, "argv": sys.argv[1:],
                                  "loss_finite": bool(torch.isfinite(loss))}), flush=True)

if __name__ == "__main__":
    main()
