//go:build unix

package integration

// This package's own tests drive background tasks by these names.
var (
	startBackground = StartBackground
	taskStatus      = TaskStatus
	awaitTask       = AwaitTask
	killTasksAfter  = KillTasksAfter
)
