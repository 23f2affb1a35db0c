package gateway

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// This file lets browser-based MCP clients of listed origins
// (Config.CORSOrigins) call the gateway: it answers their CORS preflight
// and marks their responses readable, with the MCP headers exposed.
// Requests from any other origin get no CORS headers (the browser keeps
// the response from the page) and their preflight is refused; the Host
// and authentication checks apply to every request as before.

// corsAllowHeaders are the request headers a listed origin may send.
var corsAllowHeaders = []string{"Authorization", "Content-Type", "Accept", "Mcp-Session-Id", "MCP-Protocol-Version", "Last-Event-ID"}

// corsExposeHeaders are the response headers its page may read.
var corsExposeHeaders = []string{"Mcp-Session-Id", "MCP-Protocol-Version", "WWW-Authenticate"}

// validateCORSOrigins checks that each origin is scheme://host[:port], as
// browsers send it in the Origin header.
func validateCORSOrigins(origins []string) []error {
	var errs []error
	for _, o := range origins {
		u, err := url.Parse(o)
		switch {
		case o == "*" || o == "null":
			errs = append(errs, fmt.Errorf("--cors_origins %q: list each origin (e.g. https://app.example.com); %s would admit any page", o, o))
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil:
			errs = append(errs, fmt.Errorf("--cors_origins %q: want an origin such as https://app.example.com or http://localhost:6274", o))
		case u.Scheme+"://"+u.Host != o && strings.EqualFold(u.Scheme+"://"+u.Host, o):
			errs = append(errs, fmt.Errorf("--cors_origins %q: browsers send origins in lower case: use %s", o, strings.ToLower(o)))
		case u.Scheme+"://"+u.Host != o:
			errs = append(errs, fmt.Errorf("--cors_origins %q: an origin has no path, query or fragment: use %s://%s", o, u.Scheme, u.Host))
		case strings.ToLower(o) != o:
			errs = append(errs, fmt.Errorf("--cors_origins %q: browsers send origins in lower case: use %s", o, strings.ToLower(o)))
		}
	}
	return errs
}

// cors wraps next with the CORS answers for the listed origins.
func cors(origins []string, next http.Handler) http.Handler {
	if len(origins) == 0 {
		return next
	}
	allowHeaders, exposeHeaders := strings.Join(corsAllowHeaders, ", "), strings.Join(corsExposeHeaders, ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		w.Header().Add("Vary", "Origin")
		allowed := origin != "" && slices.Contains(origins, origin)
		preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
		switch {
		case preflight && !allowed:
			http.Error(w, "origin not allowed (--cors_origins)", http.StatusForbidden)
		case preflight:
			h := w.Header()
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
			h.Set("Access-Control-Allow-Headers", allowHeaders)
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
		default:
			if allowed {
				w.Header().Set("Access-Control-Allow-Origin", origin)
				w.Header().Set("Access-Control-Expose-Headers", exposeHeaders)
			}
			next.ServeHTTP(w, r)
		}
	})
}
