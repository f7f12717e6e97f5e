"""Layout upkeep of engagement_activity: z-order by date per org, compaction and vacuum."""
