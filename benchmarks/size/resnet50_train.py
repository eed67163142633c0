"""A torchvision resnet50 training script as people launch it: batch 32 of 224x224 images, SGD."""

import argparse

import torch
import torch.nn as nn
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dataset = torchvision.datasets.FakeData(size=256, image_size=(3, 224, 224), num_classes=1000,
                                        transform=torchvision.transforms.ToTensor())
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
model = torchvision.models.resnet50().to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

for epoch in range(args.epochs):
    model.train()
    for step, (images, labels) in enumerate(loader):
        images, labels = images.to(device), labels.to(device)
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")
