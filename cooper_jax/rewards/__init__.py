"""What judges: the rule verifier, the RM input, Cooper's pairs and negatives, the LLM judge."""
