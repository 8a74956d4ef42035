"""Protocol specs shipped as package data, one YAML file each."""
