"""The command lines beside the job itself: preparing data, launching and watching jobs, counting
ranks, exporting silo files, the config reference."""
