"""tgdt: TG-DT (text-guided decision transformer) in miniature."""
