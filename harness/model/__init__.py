"""The network: timm backbones split into trunk, body and head, and FLOP accounting with fvcore; and how a
process computes on the CPU (threads, kernel set, allocator, forward chunks)."""
