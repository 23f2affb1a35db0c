// Package winjob holds the Windows Job Object calls that bash and the
// background tasks share: a command starts suspended, is put in a job
// before its first instruction runs, and resumes only then, so that every
// process it starts is in the job too and one TerminateJobObject takes
// the whole tree down; a named job is opened again by a later agent. It
// is empty on other systems, where process groups do this job.
package winjob
