"""Stage 4: rewrite a module by a plan and build one module per device."""
