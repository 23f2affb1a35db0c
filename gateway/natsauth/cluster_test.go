package natsauth

import "testing"

func FuzzRouteURLs(f *testing.F) {
	for _, s := range []string{"nats-route://gw1:6222", "gw2:6222", "nats://10.0.0.1:6222", "tls://x:1", "nats-route://u:p@h:1", "nats-route://[::1]:6222", "", "h:99999", "nats-route://h:1/p?q"} {
		f.Add(s, "gw3:6222")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		urls, err := RouteURLs([]string{a, b})
		if err != nil {
			if urls != nil {
				t.Fatal("routes with an error")
			}
			return
		}
		if len(urls) != 2 {
			t.Fatalf("%d routes for 2", len(urls))
		}
		for _, u := range urls {
			if u.Scheme != "nats-route" || u.Hostname() == "" || u.Port() == "" || u.User != nil || u.Path != "" || u.RawQuery != "" {
				t.Fatalf("accepted %q as %+v", a+","+b, u)
			}
		}
	})
}
