package service

import (
	"context"
	"time"

	"golang.org/x/sys/windows/svc"
)

// RunIfService runs run under the Windows service control manager when
// the process was started by it, and reports whether it was; stopWait is
// how long a stop may take (the agent's drain timeout and a margin), and
// reload is called on a parameter change (`sc.exe control fleet-agent
// paramchange`), the service's SIGHUP. The exit code the service reports
// is 1 when run fails.
func RunIfService(run func(context.Context) error, reload func(), stopWait time.Duration) (bool, error) {
	isService, err := svc.IsWindowsService()
	if err != nil || !isService {
		return false, err
	}
	h := &handler{run: run, reload: reload, stopWait: stopWait}
	if err := svc.Run("", h); err != nil {
		return true, err
	}
	return true, h.err
}

type handler struct {
	run      func(context.Context) error
	reload   func()
	stopWait time.Duration
	err      error
}

// Execute is the service's main: it translates the service control
// manager's requests and serve's reports.
func (h *handler) Execute(_ []string, changes <-chan svc.ChangeRequest, statuses chan<- svc.Status) (bool, uint32) {
	requests := make(chan request)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(requests)
		for {
			select {
			case <-stop:
				return
			case c, ok := <-changes:
				if !ok {
					return
				}
				r := reqInterrogate
				switch c.Cmd {
				case svc.Stop:
					r = reqStop
				case svc.Shutdown, svc.PreShutdown:
					r = reqShutdown
				case svc.ParamChange:
					r = reqReload
				}
				select {
				case requests <- r:
				case <-stop:
					return
				}
			}
		}
	}()
	h.err = serve(h.run, h.reload, requests, func(s status) { statuses <- toSvc(s) }, h.stopWait)
	if h.err != nil {
		return false, 1
	}
	return false, 0
}

func toSvc(s status) svc.Status {
	out := svc.Status{WaitHint: uint32(s.waitHint.Milliseconds())}
	switch s.state {
	case stateStartPending:
		out.State = svc.StartPending
	case stateRunning:
		out.State = svc.Running
	case stateStopPending:
		out.State = svc.StopPending
	case stateStopped:
		out.State = svc.Stopped
	}
	if s.acceptStop {
		out.Accepts = svc.AcceptStop | svc.AcceptShutdown
	}
	if s.acceptReload {
		out.Accepts |= svc.AcceptParamChange
	}
	return out
}
