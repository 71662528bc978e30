"""Reading: the plan's rows from Lance (ranges, takes, row ids, blob columns), with retries."""
