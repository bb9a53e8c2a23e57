"""The built-in tiny world: a seeded synthetic world, its corpus, tokenizer and local tasks."""
