"""Cost: what a job is billed (billing: the Alliance's bundles) and what a pack costs in RGU-hours (rgu). Pure; stands
on core's base modules only."""
