package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/skills"
)

// This file is skill rollout in the admin HTTP API (protocol/skillsadmin.go
// has the paths and bodies). The handlers are mounted by the admin
// listener, which authenticates the caller first; they take it from
// the caller function they are given.

// maxSkillPushBody bounds a push request: a full bundle, base64-encoded,
// with room for the JSON around it.
const maxSkillPushBody = protocol.MaxBundleBytes*4/3 + 4<<20

// skillsRoutes returns the skill handlers by ServeMux pattern. caller
// returns the authenticated caller of a request.
func (g *Gateway) skillsRoutes(caller func(*http.Request) *access.Identity) map[string]http.HandlerFunc {
	sk, ro := protocol.AdminSkillsPath, protocol.AdminRolloutsPath
	return map[string]http.HandlerFunc{
		"GET " + sk: func(w http.ResponseWriter, r *http.Request) {
			out, err := g.Skills(r.Context())
			writeSkillsAnswer(w, nonNil(out), err)
		},
		"POST " + sk: func(w http.ResponseWriter, r *http.Request) {
			var req protocol.SkillPushRequest
			if !readSkillsBody(w, r, maxSkillPushBody, &req) {
				return
			}
			out, err := g.PushSkill(r.Context(), caller(r), req.Name, req.Files)
			writeSkillsAnswer(w, out, err)
		},
		"GET " + sk + "/{name}": func(w http.ResponseWriter, r *http.Request) {
			out, err := g.SkillVersions(r.Context(), r.PathValue("name"))
			writeSkillsAnswer(w, out, err)
		},
		"POST " + sk + "/{name}/remove": func(w http.ResponseWriter, r *http.Request) {
			var req protocol.SkillRemoveRequest
			if !readSkillsBody(w, r, 64<<10, &req) {
				return
			}
			out, err := g.RemoveSkill(r.Context(), caller(r), r.PathValue("name"), req.Selector)
			writeSkillsAnswer(w, out, err)
		},
		"GET " + ro: func(w http.ResponseWriter, r *http.Request) {
			out, err := g.Rollouts(r.Context())
			writeSkillsAnswer(w, nonNil(out), err)
		},
		"POST " + ro: func(w http.ResponseWriter, r *http.Request) {
			var req protocol.RolloutRequest
			if !readSkillsBody(w, r, 64<<10, &req) {
				return
			}
			out, err := g.StartRollout(r.Context(), caller(r), req)
			writeSkillsAnswer(w, out, err)
		},
		"GET " + ro + "/{id}": func(w http.ResponseWriter, r *http.Request) {
			out, err := g.RolloutStatus(r.Context(), r.PathValue("id"), r.URL.Query().Get("hosts") != "")
			writeSkillsAnswer(w, out, err)
		},
		"POST " + ro + "/{id}/{action}": func(w http.ResponseWriter, r *http.Request) {
			id, by := r.PathValue("id"), caller(r)
			var out protocol.RolloutInfo
			var err error
			switch r.PathValue("action") {
			case protocol.RolloutPause:
				out, err = g.PauseRollout(r.Context(), by, id)
			case protocol.RolloutResume:
				out, err = g.ResumeRollout(r.Context(), by, id)
			case protocol.RolloutRollback:
				out, err = g.RollbackRollout(r.Context(), by, id)
			default:
				err = fmt.Errorf("%w: action %q: use pause, resume or rollback", skills.ErrRefused, protocol.Clip(r.PathValue("action"), 40))
			}
			writeSkillsAnswer(w, out, err)
		},
	}
}

// readSkillsBody decodes a JSON body of at most limit bytes into v, or
// answers 400.
func readSkillsBody(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		msg := "the body is not the expected JSON: " + err.Error()
		if errors.As(err, &tooBig) {
			msg = fmt.Sprintf("the body is over %d bytes", limit)
		}
		writeSkillsError(w, http.StatusBadRequest, protocol.APIBadRequest, msg)
		return false
	}
	return true
}

// writeSkillsAnswer answers v as JSON, or err as an APIError.
func writeSkillsAnswer(w http.ResponseWriter, v any, err error) {
	switch {
	case err == nil:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	case errors.Is(err, skills.ErrRefused):
		writeSkillsError(w, http.StatusBadRequest, protocol.APIBadRequest, err.Error())
	case errors.Is(err, skills.ErrRolloutState):
		writeSkillsError(w, http.StatusConflict, protocol.APIBadRequest, err.Error())
	case errors.Is(err, skills.ErrNotFound):
		writeSkillsError(w, http.StatusNotFound, protocol.APINotFound, err.Error())
	default:
		writeSkillsError(w, http.StatusServiceUnavailable, protocol.APIUnavailable, err.Error())
	}
}

func writeSkillsError(w http.ResponseWriter, status int, code protocol.APICode, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(&protocol.APIError{Code: code, Message: msg})
}
