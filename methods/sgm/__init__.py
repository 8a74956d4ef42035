"""SGM (Harun & Kanan 2024): four stability-gap mitigations as modifiers of the standard step."""
