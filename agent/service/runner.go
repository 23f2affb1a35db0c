package service

import (
	"context"
	"time"
)

// The service control manager's conversation with a service, as plain Go
// so that it is tested on any system: the Windows adapter
// (run_windows.go) translates svc.ChangeRequest and svc.Status to and
// from these.

// request is a control the service control manager sends.
type request int

const (
	reqInterrogate request = iota
	reqStop
	reqShutdown
	// reqReload is SERVICE_CONTROL_PARAMCHANGE (`sc.exe control
	// fleet-agent paramchange`): what SIGHUP is elsewhere.
	reqReload
)

// state is what the service reports.
type state int

const (
	stateStartPending state = iota
	stateRunning
	stateStopPending
	stateStopped
)

// status is one report to the service control manager. acceptStop says
// the service takes stop and shutdown controls, acceptReload parameter
// changes; waitHint is how long a pending state may last.
type status struct {
	state        state
	acceptStop   bool
	acceptReload bool
	waitHint     time.Duration
}

// serve runs run as a service: it reports the service running, answers
// interrogations, and on a stop or a shutdown cancels run's context, on
// which the agent drains, reporting the stop as pending for up to
// stopWait; it returns run's error once run has returned, after
// reporting the service stopped. A run that ends by itself (a bad
// configuration, say) ends the service the same way. A parameter change
// calls reload (when not nil), which must not block.
func serve(run func(context.Context) error, reload func(), requests <-chan request, report func(status), stopWait time.Duration) error {
	report(status{state: stateStartPending, waitHint: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	running := status{state: stateRunning, acceptStop: true, acceptReload: reload != nil}
	report(running)
	for {
		select {
		case err := <-done:
			report(status{state: stateStopped})
			return err
		case r, ok := <-requests:
			switch {
			case !ok, r == reqStop, r == reqShutdown:
				report(status{state: stateStopPending, waitHint: stopWait})
				cancel()
				err := <-done
				report(status{state: stateStopped})
				return err
			case r == reqReload && reload != nil:
				reload()
				report(running)
			default:
				report(running)
			}
		}
	}
}
