"""The network: timm backbones split into trunk, body and head, and FLOP accounting with fvcore."""
