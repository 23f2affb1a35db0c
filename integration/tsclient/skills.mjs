// Drives the TypeScript MCP SDK client against a gateway's MCP Skills
// extension: skills/list (every page), skills/get of one skill, a
// resources/read of each of its files, and skills/get of an unknown
// skill. It prints what it saw as JSON for the Go test to check.
//
//	node skills.mjs MCP_URL SKILL_NAME
import { createHash } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ResultSchema } from '@modelcontextprotocol/sdk/types.js';

const [url, name] = process.argv.slice(2);
const client = new Client({ name: 'fleet-ts-test', version: '1' });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));

const skills = [];
let cursor;
do {
	const page = await client.request({ method: 'skills/list', params: cursor ? { cursor } : {} }, ResultSchema);
	skills.push(...page.skills);
	cursor = page.nextCursor;
} while (cursor);

const listed = skills.find((s) => s.frontmatter.name === name);
if (!listed) throw new Error(`skills/list has no skill ${name}`);
const got = await client.request({ method: 'skills/get', params: { uri: listed.uri } }, ResultSchema);

const files = {};
for (const f of got.skill.resources) {
	const res = await client.readResource({ uri: f.uri });
	const c = res.contents[0];
	const bytes = c.text !== undefined ? Buffer.from(c.text, 'utf8') : Buffer.from(c.blob, 'base64');
	files[f.uri] = {
		size: bytes.length,
		digest: 'sha256:' + createHash('sha256').update(bytes).digest('hex'),
		base64: bytes.toString('base64'),
		mimeType: c.mimeType,
	};
}

let unknown = null;
try {
	await client.request({ method: 'skills/get', params: { uri: 'skill://no-such-skill/SKILL.md' } }, ResultSchema);
} catch (e) {
	unknown = { code: e.code, message: e.message };
}

console.log(JSON.stringify({
	extensions: client.getServerCapabilities()?.extensions ?? null,
	names: skills.map((s) => s.frontmatter.name),
	listed,
	got: got.skill,
	files,
	unknown,
}));
await client.close();
