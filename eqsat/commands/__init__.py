"""The `eqsat` subcommands (`eqsat.cli.COMMANDS` names them): each parses its flags and calls library
code. They sit above both the core and the JAX backend (`eqsat optimize` and `eqsat parallel` check
their results through JAX: `jax_backend.checks`); nothing in the core imports them."""
