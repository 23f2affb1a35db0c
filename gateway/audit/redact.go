package audit

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// This file turns a tool call's arguments into the summary kept in the
// audit trail: what was done and where (command text, paths, sizes),
// never file contents, and with secret-looking values blanked. Redaction
// is best effort: it catches the common shapes (KEY=value assignments,
// --password flags, Authorization headers, URL credentials and query
// parameters, well-known token formats, NATS seeds and this fleet's join
// tokens, private keys, the user/password forms of database and FTP
// tools), not every secret a command might hold.

const (
	// maxSummaryText bounds one string kept in a summary.
	maxSummaryText = 2000
	redacted       = "[redacted]"
)

// isContentArg reports arguments that carry file contents or edits: only
// their size is kept.
func isContentArg(name string) bool {
	switch name {
	case "content", "data", "edits", "old_string", "new_string", "patch", "diff":
		return true
	}
	return false
}

// apiTokenPrefix begins the gateway's API tokens, which are blanked as
// other known tokens are.
const apiTokenPrefix = "fmcp_"

// shared is the redactor of every summary, built at its first use (its
// rules take a while to compile).
var shared = sync.OnceValue(newRedactor)

// ArgsSummary returns the audit summary of a call's arguments: scalars
// as they are (strings redacted and bounded), contents and nested values
// by size only, secret-named arguments blanked. Arguments that are not a
// JSON object are summarised by size.
func ArgsSummary(raw json.RawMessage) map[string]any { return shared().args(raw) }

// ShrunkArgsSummary is ArgsSummary for arguments whose long strings were
// cut: sizes gives each top-level value's size in full.
func ShrunkArgsSummary(raw json.RawMessage, sizes map[string]int) map[string]any {
	return shared().shrunkArgs(raw, sizes)
}

// LastLine returns the last non-empty line of s, redacted and bounded:
// the status line of a bash result, or a one-line error message.
func LastLine(s string) string { return shared().lastLine(s) }

// redactor blanks secrets. Build one with newRedactor and share it; it is
// safe for concurrent use.
type redactor struct {
	// secretKey matches argument names whose values are secrets.
	secretKey *regexp.Regexp
	// rules rewrite secret-looking parts of free text, in order.
	rules []redaction
}

// redaction is one class of secret in free text. re finds it, and each
// match becomes repl (a template for Regexp.Expand that keeps what is not
// secret: the option, the user name, the header and its scheme), unless
// spare, given the match's groups, says it is a harmless look-alike.
//
// A rule runs only on text holding one of need (lower case): the regular
// expressions are slow, and most commands hold no secret.
type redaction struct {
	name  string
	need  []string
	re    *regexp.Regexp
	repl  string
	spare func(groups []string) bool
}

// Pieces of the patterns below.
const (
	// value is a word's value: quoted, or up to a space, a quote or a
	// shell operator.
	value = `(?:'[^']*'|"(?:[^"\\]|\\.)*"|\$'[^']*'|[^\s'"();&|<>]+)`
	// secretName is a name (of a variable, an option, a JSON key) that
	// says its value is a secret.
	secretName = `(?:pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|cred(?:ential)?s?|auth|cookie)`
	// optValue is an option's value: a value that does not start with
	// "-", which would be the next option.
	optValue = `(?:'[^']*'|"(?:[^"\\]|\\.)*"|\$'[^']*'|[^\s'"();&|<>-][^\s'"();&|<>]*)`
)

func newRedactor() *redactor {
	return &redactor{
		secretKey: regexp.MustCompile(`(?i)pass(word|wd|phrase)?$|secret|token|api_?key|credential|private_?key|^auth`),
		rules:     append(programRules(), namedRules()...),
	}
}

// programRules are the redactions of headers, URL credentials and
// programs' password options; they run before namedRules.
func programRules() []redaction {
	return []redaction{
		// PEM private keys, PGP key blocks, and the seed block of a NATS
		// credentials file (whose END line has six dashes).
		{name: "private key", need: []string{"private key", "nkey seed"}, re: regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*(?:PRIVATE KEY|NKEY SEED)(?: BLOCK)?-----[\s\S]*?(?:-{5,6}END [A-Z0-9 ]*(?:PRIVATE KEY|NKEY SEED)(?: BLOCK)?-{5,6}|$)`),
			repl: "[redacted private key]"},
		// Authorization: Bearer X, in a quoted header or bare.
		{name: "authorization header", need: []string{"authorization"}, re: regexp.MustCompile(`(?i)(?P<keep>\b(?:proxy-)?authorization\s*:\s*(?:(?:bearer|basic|token|digest|negotiate|ntlm|apikey|aws4-hmac-sha256)(?:\\?\s)+)?)(?:[^\s'"]+)`),
			repl: "${keep}" + redacted},
		{name: "api key header", need: []string{"api-key", "-token"}, re: regexp.MustCompile(`(?i)(?P<keep>\b(?:x-api-key|api-key|x-auth-token|private-token|x-vault-token|x-amz-security-token|x-goog-api-key)\s*:\s*)(?:[^\s'"]+)`),
			repl: "${keep}" + redacted},
		// A cookie header holds name=value pairs to the end of its quotes.
		{name: "cookie header", need: []string{"cookie"}, re: regexp.MustCompile(`(?i)(?P<keep>['"](?:set-)?cookie\s*:\s*)[^'"\r\n]+`), repl: "${keep}" + redacted},
		{name: "bare cookie header", need: []string{"cookie"}, re: regexp.MustCompile(`(?i)(?P<keep>\b(?:set-)?cookie\s*:\s*)[^\s'"]+`), repl: "${keep}" + redacted},
		{name: "bearer", need: []string{"bearer", "basic"}, re: regexp.MustCompile(`(?i)(?P<keep>\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]{8,}`), repl: "${keep}" + redacted},
		// scheme://user:password@host keeps the user.
		{name: "url credentials", need: []string{"@"}, re: regexp.MustCompile(`(?P<keep>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'"]*:)[^@\s/'"]+@`), repl: "${keep}" + redacted + "@"},
		// curl -u user:password, --user user:password; not uid:gid.
		{name: "user option", need: []string{"-u", "--user", "--proxy-user"}, re: regexp.MustCompile(`(?P<keep>(?:^|\s)(?:-u\s*|--user[=\s]\s*|--proxy-user[=\s]\s*)['"]?(?P<user>[^\s:'"]*):)(?P<pass>[^\s'"]+)`),
			repl: "${keep}" + redacted, spare: func(g []string) bool {
				return allDigits(g[2]) && allDigits(g[3]) || strings.HasPrefix(g[3], "//") || strings.Contains(g[3], redacted)
			}},
		// Programs that take a password glued to a short option (mysql
		// -pSECRET) or after one (sshpass -p SECRET, redis-cli -a SECRET).
		{name: "mysql -p", need: []string{"mysql", "mariadb"}, re: regexp.MustCompile(`(?P<keep>\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck|mysqlpump|mysqlsh|mariadb|mariadb-dump|mariadb-admin|mariadb-import|mariadb-check)\b[^;&|\n]*?\s-p)` + value),
			repl: "${keep}" + redacted},
		{name: "password short option", need: []string{"sshpass", "redis-cli", "ldap", "mongo"}, re: regexp.MustCompile(`(?P<keep>\b(?:sshpass(?:\s+-[a-oq-zA-Z]\S*)*\s+-p|redis-cli\b[^;&|\n]*?\s-a|ldap(?:search|add|modify|delete|passwd|whoami)\b[^;&|\n]*?\s-w|(?:mongo|mongosh|mongodump|mongorestore)\b[^;&|\n]*?\s-p)\s*)` + value),
			repl: "${keep}" + redacted},
		{name: "smbclient -U", need: []string{"smbclient", "rpcclient", "smbmap"}, re: regexp.MustCompile(`(?P<keep>\b(?:smbclient|rpcclient|smbmap)\b[^;&|\n]*?\s-U\s*['"]?[^\s%'"]+%)[^\s'"]+`), repl: "${keep}" + redacted},
		// Registry and cloud logins: docker login -u bob -p SECRET (not
		// docker run -p 8080:80, a port).
		{name: "login -p", need: []string{"login"}, re: regexp.MustCompile(`(?P<keep>\b(?:docker|podman|buildah|nerdctl|helm|oras|skopeo|crane|regctl|az|cf)\b[^;&|\n]*?\blogin\b[^;&|\n]*?\s-p\s*)` + value),
			repl: "${keep}" + redacted},
		{name: "sqlcmd -P", need: []string{"sqlcmd", "bcp", "osql", "isql"}, re: regexp.MustCompile(`(?P<keep>\b(?:sqlcmd|bcp|osql|isql)\b[^;&|\n]*?\s-P\s*)` + value), repl: "${keep}" + redacted},
		{name: "archive password", need: []string{"zip", "7z"}, re: regexp.MustCompile(`(?P<keep>\b(?:(?:zip|unzip|zipcloak)\b[^;&|\n]*?\s-P\s*|7z[ar]?\b[^;&|\n]*?\s-p))` + value),
			repl: "${keep}" + redacted},
		{name: "gh secret set", need: []string{"gh"}, re: regexp.MustCompile(`(?P<keep>\bgh\s+secret\s+set\b[^;&|\n]*?\s(?:--body[=\s]\s*|-b\s*))` + value), repl: "${keep}" + redacted},
		// ssh-keygen -N NEW -P OLD: both options, wherever they are, in
		// text that runs ssh-keygen (a number is a port or a count).
		{name: "ssh-keygen -N", need: []string{"ssh-keygen"}, re: regexp.MustCompile(`(?P<keep>(?:^|\s)-[NP]\s*)(?P<val>` + value + `)`), repl: "${keep}" + redacted,
			spare: func(g []string) bool { return allDigits(g[2]) || strings.Contains(g[2], redacted) }},
		// htpasswd -b FILE USER PASSWORD, htpasswd -nb USER PASSWORD.
		{name: "htpasswd -b", need: []string{"htpasswd"}, re: regexp.MustCompile(`(?P<keep>\bhtpasswd\s+(?P<opts>(?:-[A-Za-z]+\s+)+)(?:[^\s-]\S*\s+)?[^\s-]\S*\s+)(?P<val>` + value + `)`),
			repl: "${keep}" + redacted, spare: spareHtpasswd},
		{name: "openssl pass:", need: []string{"pass:"}, re: regexp.MustCompile(`(?P<keep>\bpass:)[^\s'"]+`), repl: "${keep}" + redacted},
		// openssl enc -k PASSWORD.
		{name: "openssl -k", need: []string{"openssl"}, re: regexp.MustCompile(`(?P<keep>\bopenssl\b[^;&|\n]*?\s-k\s+)` + value), repl: "${keep}" + redacted},
		// httpie and xh: -a user:password, --auth user:password.
		{name: "httpie -a", need: []string{"-a", "--auth"}, re: regexp.MustCompile(`(?P<keep>\b(?:http|https|xh|xhs|httpie)\b[^;&|\n]*?\s(?:-a\s*|--auth[=\s]\s*)['"]?[^\s:'"]*:)(?P<pass>[^\s'"]+)`),
			repl: "${keep}" + redacted, spare: func(g []string) bool { return strings.Contains(g[2], redacted) }},
		// lftp -u user,password (also in the commands of lftp -e).
		{name: "lftp -u", need: []string{"lftp"}, re: regexp.MustCompile(`(?P<keep>\b(?:lftp|open)\b[^;&|\n]*?\s-u\s*['"]?[^\s,'"]*,)(?P<pass>[^\s'"]+)`),
			repl: "${keep}" + redacted, spare: func(g []string) bool { return strings.Contains(g[2], redacted) }},
		// Oracle's tools take user/password[@db]: sqlplus scott/tiger@db,
		// rman target sys/x, exp userid=scott/tiger.
		{name: "oracle user/password", need: []string{"sqlplus", "sqlldr", "expdp", "impdp", "exp", "imp", "rman", "dgmgrl", "userid="},
			re:   regexp.MustCompile(`(?i)(?P<keep>(?:\b(?:sqlplus|sqlldr|expdp|impdp|exp|imp|dgmgrl)(?:\s+-[a-z]+)*|\brman\b[^;&|\n]*?\b(?:target|catalog|auxiliary)|\buserid=)\s*['"]?[^\s/'"@]+/)(?P<pass>[^\s@'"]+)`),
			repl: "${keep}" + redacted, spare: func(g []string) bool { return strings.Contains(g[2], redacted) }},
	}
}

// namedRules are the redactions of URL parameters, options, assignments
// and keys named like secrets, and of known token formats.
func namedRules() []redaction {
	tokens := strings.Join([]string{
		`gh[pousr]_[A-Za-z0-9]{20,}`, `github_pat_[A-Za-z0-9_]{20,}`, // GitHub
		`glpat-[A-Za-z0-9_-]{20,}`,                                // GitLab
		`xox[abposr]-[A-Za-z0-9-]{10,}`, `xapp-[A-Za-z0-9-]{10,}`, // Slack
		`(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}`, // Stripe
		`sk-[A-Za-z0-9_-]{20,}`,                    // OpenAI, Anthropic
		`AIza[A-Za-z0-9_-]{35}`,                    // Google
		`(?:AKIA|ASIA)[A-Z0-9]{16}`,                // AWS access key ids
		`npm_[A-Za-z0-9]{36}`, `pypi-[A-Za-z0-9_-]{50,}`, `hf_[A-Za-z0-9]{30,}`,
		`SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}`, `dop_v1_[a-f0-9]{64}`,
		`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*`, // JWTs
		`hv[sbr]\.[A-Za-z0-9_-]{20,}`,                             // Vault
		// Webhook URLs are their own credential.
		`hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]+`, `discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_-]+`,
		apiTokenPrefix + `[A-Za-z0-9_-]{20,}`,
	}, "|")
	// secretWords are in every name secretName matches; tokenStarts
	// begin every token in tokens.
	secretWords := []string{"pass", "pwd", "secret", "token", "key", "cred", "auth", "cookie"}
	tokenStarts := []string{"gh", "glpat-", "xox", "xapp-", "sk_", "rk_", "sk-", "aiza", "akia", "asia", "npm_", "pypi-", "hf_", "sg.", "dop_v1_", "eyj",
		"hvs.", "hvb.", "hvr.", "hooks.slack.com", "discord", apiTokenPrefix}
	return []redaction{
		// A URL's query parameters named like secrets: ?key=, &token=,
		// &password=, ;session=.
		{name: "url query secret", need: []string{"?", "&"}, re: regexp.MustCompile(`(?i)(?P<keep>[?&;](?P<name>[a-z0-9_.-]*(?:key|token|secret|passw(?:or)?d|pass|pwd|auth|session|credentials?))=)(?P<val>[^&\s'"#]+)`),
			repl: "${keep}" + redacted, spare: func(g []string) bool { return harmlessKeyName(g[2]) || strings.Contains(g[3], redacted) }},
		// Signed URLs: Azure SAS (sig=), S3 and GCS presigned URLs.
		{name: "url signature", need: []string{"sig=", "signature="}, re: regexp.MustCompile(`(?i)(?P<keep>[?&](?:sig|x-amz-signature|x-goog-signature|signature)=)[^&\s'"#]+`),
			repl: "${keep}" + redacted},
		// --password X, --password=X, --api-key X, -password X...
		{name: "secret option", need: secretWords, re: regexp.MustCompile(`(?i)(?P<keep>(?:^|\s)--?(?P<opt>[a-z0-9_-]*` + secretName + `[a-z0-9_-]*)(?:=|\s+))(?P<val>` + optValue + `)`),
			repl: "${keep}" + redacted, spare: spareOption},
		// --signing-key X, --encryption-key=X: an option whose name ends in
		// "key", unless it names a file or an id, or the value is one.
		{name: "key option", need: []string{"key"}, re: regexp.MustCompile(`(?i)(?P<keep>(?:^|\s)--?(?P<opt>(?:[a-z0-9]+[_-])*key)(?:=|\s+))(?P<val>` + optValue + `)`),
			repl: "${keep}" + redacted, spare: func(g []string) bool {
				return harmlessKeyName(g[2]) || strings.Contains(g[3], redacted) || keyNamesFile(g[3])
			}},
		// APP_KEY=x, ENCRYPTION_KEY=x, SIGNING_KEY=x: a variable whose name
		// ends in KEY.
		{name: "key assignment", need: []string{"key"}, re: regexp.MustCompile(`(?i)(?P<keep>\b(?P<var>(?:[a-z0-9]+[_-])*key)=)(?P<val>` + value + `)`),
			repl: "${keep}" + redacted, spare: func(g []string) bool { return harmlessKeyName(g[2]) || strings.Contains(g[3], redacted) }},
		// NAME=value where the name says secret: PGPASSWORD=x, export
		// API_TOKEN=x, env AWS_SECRET_ACCESS_KEY=x, ?password=x&.
		{name: "secret assignment", need: secretWords, re: regexp.MustCompile(`(?i)(?P<keep>\b(?P<var>[a-z0-9_]*` + secretName + `[a-z0-9_]*)=)(?P<val>` + value + `)`),
			repl: "${keep}" + redacted, spare: spareAssignment},
		// "password": "x" in JSON, password: x at the start of a YAML line.
		{name: "json secret", need: secretWords, re: regexp.MustCompile(`(?i)(?P<keep>"[a-z0-9_-]*` + secretName + `[a-z0-9_-]*"\s*:\s*)"(?:[^"\\]|\\.)*"`), repl: "${keep}\"" + redacted + "\"",
			spare: func(g []string) bool { return harmlessName(g[1]) }},
		{name: "yaml secret", need: secretWords, re: regexp.MustCompile(`(?im)(?P<keep>^[ \t]*[a-z0-9_-]*` + secretName + `[a-z0-9_-]*[ \t]*:[ \t]+)[^\s#].*$`),
			repl: "${keep}" + redacted, spare: func(g []string) bool { return harmlessName(g[1]) }},
		{name: "netrc", need: []string{"machine"}, re: regexp.MustCompile(`(?P<keep>\bmachine\s+\S+(?:\s+login\s+\S+)?\s+password\s+)[^\s'"]+`), repl: "${keep}" + redacted},
		{name: "known token", need: tokenStarts, re: regexp.MustCompile(`\b(?:` + tokens + `)`), repl: redacted},
		// NATS nkey seeds (S, then U, A, O, N, C or X, then 56 base32
		// characters): the private keys of NATS users, accounts,
		// operators and servers, this fleet's agents among them.
		{name: "nkey seed", need: []string{"su", "sa", "so", "sn", "sc", "sx"}, re: regexp.MustCompile(`\bS[UAONCX][A-Z2-7]{56}\b`), repl: redacted},
		// This fleet's join tokens keep their id: fmcp1.ID.SECRET, and
		// the NATS join token, which holds a credential, entire.
		{name: "join token", need: []string{protocol.TokenPrefix + "."}, re: regexp.MustCompile(`\b(?P<keep>` + protocol.TokenPrefix + `\.[a-z2-7]+\.)[A-Za-z0-9_-]+`), repl: "${keep}" + redacted},
		{name: "nats join token", need: []string{protocol.NATSTokenPrefix + "."}, re: regexp.MustCompile(`\b(?P<keep>` + protocol.NATSTokenPrefix + `\.)[A-Za-z0-9_-]+`), repl: "${keep}" + redacted},
		// Vault's older service and batch tokens: s. or b. and 24
		// characters.
		{name: "vault token", need: []string{"s.", "b."}, re: regexp.MustCompile(`(?P<keep>(?:^|[\s'"=:,]))(?P<tok>[sb]\.[A-Za-z0-9]{24})(?P<tail>$|[^A-Za-z0-9._-])`),
			repl: "${keep}" + redacted + "${tail}", spare: func(g []string) bool { return strings.Trim(g[2][2:], "abcdefghijklmnopqrstuvwxyz") == "" }},
		// An AWS secret access key is 40 characters of base64, told from
		// other such words by AWS being mentioned in the same text (need).
		{name: "aws secret key", need: []string{"aws", "akia", "asia"}, re: regexp.MustCompile(`(?P<keep>(?:^|[^A-Za-z0-9/+=]))(?P<key>[A-Za-z0-9/+]{40})(?P<tail>$|[^A-Za-z0-9/+=])`),
			repl: "${keep}" + redacted + "${tail}", spare: spareAWSKey},
	}
}

// harmlessName reports whether name (of an option, a variable, a key),
// which holds a word that says secret, names something that is not one:
// where a secret is kept (a file, a variable, stdin), what kind it is, a
// flag that turns one off (--no-password), or a word that merely
// contains one (author, max-tokens, bypass).
func harmlessName(name string) bool {
	n := strings.ToLower(strings.Trim(name, " \t:\""))
	n = strings.NewReplacer("_", "-").Replace(n)
	for _, suffix := range []string{"file", "path", "stdin", "env", "cmd", "command", "prompt", "type", "length", "len", "-id",
		"name", "url", "dir", "ttl", "jar", "user", "username", "host", "method", "mode", "expiry", "expires"} {
		if strings.HasSuffix(n, suffix) {
			return true
		}
	}
	if strings.HasPrefix(n, "no-") || strings.Contains(n, "author") && !strings.Contains(n, "authoriz") {
		return true
	}
	for _, word := range []string{"tokens", "tokenizer", "passive", "passthrough", "pass-through", "bypass", "compass", "passes", "passage"} {
		if strings.Contains(n, word) {
			return true
		}
	}
	return n == "pwd" || n == "oldpwd"
}

// harmlessKeyName reports whether name, which ends in "key", names
// something that is not a secret: a key of a table or a cache, a public
// key, or a file or an id (harmlessName).
func harmlessKeyName(name string) bool {
	n := strings.ToLower(strings.NewReplacer("_", "-").Replace(strings.Trim(name, " \t:\"")))
	for _, word := range []string{"primary", "sort", "partition", "cache", "foreign", "routing", "hash", "range", "idempotency",
		"public", "pub", "lookup", "map", "group", "dedup", "shard", "hot", "monkey", "tur"} {
		if strings.HasSuffix(n, word+"-key") || n == word+"key" {
			return true
		}
	}
	return harmlessName(n)
}

// keyNamesFile reports whether the value of a key option names a file,
// a descriptor or a position rather than holding the key: a path, a file
// name with a key file's extension, @FILE, env:, file: or fd:, or
// numbers (sort --key 2,3).
func keyNamesFile(v string) bool {
	v = strings.Trim(v, `'"`)
	if strings.ContainsAny(v, `/\`) || strings.HasPrefix(v, "@") || strings.HasPrefix(v, "env:") || strings.HasPrefix(v, "file:") ||
		strings.HasPrefix(v, "fd:") || strings.HasPrefix(v, "~") || strings.Trim(v, "0123456789,.nrbf") == "" {
		return true
	}
	for _, ext := range []string{".pem", ".key", ".json", ".p12", ".pfx", ".asc", ".gpg", ".crt", ".der", ".pub", ".txt"} {
		if strings.HasSuffix(strings.ToLower(v), ext) {
			return true
		}
	}
	return false
}

// spareOption spares options whose names say secret but whose values are
// not (see harmlessName), and a short option with a value glued on
// (-pS3cretPass): the word after it is not its value.
func spareOption(g []string) bool {
	glued := !strings.HasPrefix(strings.TrimSpace(g[1]), "--") && strings.ContainsAny(g[2], "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
	return harmlessName(g[2]) || strings.Contains(g[3], redacted) || glued || passwordSource(g[3])
}

// passwordSource reports whether an option's value says where a password
// is rather than holding it, as openssl's do: env:VAR, file:PATH, fd:N,
// stdin.
func passwordSource(v string) bool {
	v = strings.Trim(v, `'"`)
	return strings.HasPrefix(v, "env:") || strings.HasPrefix(v, "file:") || strings.HasPrefix(v, "fd:") || v == "stdin"
}

// spareHtpasswd spares an htpasswd command line without -b, whose
// password is not on it, and one whose -n leaves no file before the user
// name when the match took one.
func spareHtpasswd(g []string) bool {
	opts := strings.ReplaceAll(strings.Join(strings.Fields(g[2]), ""), "-", "")
	words := strings.Fields(strings.TrimPrefix(g[1][strings.Index(g[1], g[2])+len(g[2]):], " "))
	want := 2 // FILE USER
	if strings.Contains(opts, "n") {
		want = 1 // USER
	}
	return !strings.Contains(opts, "b") || len(words) != want || strings.Contains(g[3], redacted)
}

// spareAssignment spares variables named like secrets that hold none
// (see harmlessName): PWD and OLDPWD, names of files, ids.
func spareAssignment(g []string) bool {
	return harmlessName(g[2]) || strings.Contains(g[3], redacted)
}

// spareAWSKey spares 40-character words that are not AWS secret keys:
// hexadecimal ones (git object names, SHA-1 sums), and ones without upper
// and lower case letters and digits. (The rule runs only on text that
// mentions AWS.)
func spareAWSKey(g []string) bool {
	key := g[2]
	if strings.Trim(key, "0123456789abcdefABCDEF") == "" {
		return true
	}
	return !strings.ContainsAny(key, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") || !strings.ContainsAny(key, "abcdefghijklmnopqrstuvwxyz") ||
		!strings.ContainsAny(key, "0123456789")
}

func allDigits(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }

// text blanks secret-looking parts of s and bounds its length.
func (r *redactor) text(s string) string {
	// Bound the regexp work first; what is cut here is cut below anyway.
	s = textutil.Truncate(s, 4*maxSummaryText)
	// Redaction only takes text away: a word not in s at first is in none
	// of its later forms.
	lower := strings.ToLower(s)
	for i := range r.rules {
		rule := &r.rules[i]
		if slices.ContainsFunc(rule.need, func(w string) bool { return strings.Contains(lower, w) }) {
			s = rule.apply(s)
		}
	}
	return textutil.Truncate(s, maxSummaryText)
}

// apply blanks the matches of rule in s.
func (rule *redaction) apply(s string) string {
	if rule.repl != "" && rule.spare == nil && !strings.Contains(rule.repl, "$") {
		return rule.re.ReplaceAllLiteralString(s, rule.repl)
	}
	if rule.spare == nil {
		return rule.re.ReplaceAllString(s, rule.repl)
	}
	var b strings.Builder
	last := 0
	for _, m := range rule.re.FindAllStringSubmatchIndex(s, -1) {
		groups := make([]string, len(m)/2)
		for i := range groups {
			if m[2*i] >= 0 {
				groups[i] = s[m[2*i]:m[2*i+1]]
			}
		}
		if rule.spare(groups) {
			continue
		}
		b.WriteString(s[last:m[0]])
		b.Write(rule.re.ExpandString(nil, rule.repl, s, m))
		last = m[1]
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// args returns the audit summary of a call's arguments: scalars
// as they are (strings redacted and bounded), contents and nested values
// by size only, secret-named arguments blanked. Arguments that are not a
// JSON object are summarised by size.
func (r *redactor) args(raw json.RawMessage) map[string]any {
	return r.shrunkArgs(raw, nil)
}

// shrunkArgs is args for arguments whose long strings were cut
// (shrinkArgs): sizes gives each top-level value's size in full.
func (r *redactor) shrunkArgs(raw json.RawMessage, sizes map[string]int) map[string]any {
	if len(raw) == 0 {
		return nil
	}
	var args map[string]any
	if err := json.Unmarshal(raw, &args); err != nil {
		return map[string]any{"unreadable_bytes": len(raw)}
	}
	out := make(map[string]any, len(args))
	for k, v := range args {
		size, ok := sizes[k]
		if !ok {
			size = jsonSize(v)
		}
		switch {
		case r.secretKey.MatchString(k):
			out[k] = redacted
		case isContentArg(k):
			out[k+"_bytes"] = size
		default:
			out[k] = r.value(v, size)
		}
	}
	return out
}

// value summarises v, whose size in full is size.
func (r *redactor) value(v any, size int) any {
	switch v := v.(type) {
	case string:
		if size > len(v) {
			// Cut already: keep what the summary keeps, and say how
			// much there was.
			return textutil.Truncate(r.text(v), maxSummaryText-40) + fmt.Sprintf(" [%d bytes in all]", size)
		}
		return r.text(v)
	case float64, bool, nil:
		return v
	case []any:
		return fmt.Sprintf("[%d items, %d bytes]", len(v), size)
	default:
		return fmt.Sprintf("[object, %d bytes]", size)
	}
}

func jsonSize(v any) int {
	if s, ok := v.(string); ok {
		return len(s)
	}
	data, _ := json.Marshal(v)
	return len(data)
}

// lastLine returns the last non-empty line of s, redacted and bounded:
// the status line of a bash result, or a one-line error message.
func (r *redactor) lastLine(s string) string {
	s = strings.TrimRight(s, "\n ")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return textutil.Truncate(r.text(s), 300)
}
