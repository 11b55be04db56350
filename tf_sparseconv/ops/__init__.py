"""Thin Python wrappers over the compiled ops; each module registers its op's gradient."""
