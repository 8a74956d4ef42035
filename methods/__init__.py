"""Built-in continual learning methods and the SGM modifiers, registered through entry points."""
