"""Spend as governance: prices, what each request cost, budgets and where spend is kept."""
