"""The near-miss verifier's word lists: what changes an answer (numbers, units, negation, opposites, times,
comparatives, quantifiers, names) and what a rephrasing may change freely (filler, synonyms). English and Korean.
Derived lookup tables are built once at import."""

from __future__ import annotations

NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "fourteen": "14",
    "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18", "nineteen": "19", "twenty": "20",
    "thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000", "million": "1e6",
    "billion": "1e9", "half": "0.5", "quarter": "0.25", "dozen": "12",
}

# canonical unit -> spellings
UNITS = {
    "km": ("km", "kms", "kilometer", "kilometers", "kilometre", "kilometres", "킬로미터", "킬로"),
    "mile": ("mi", "mile", "miles", "마일"),
    "m": ("meter", "meters", "metre", "metres", "미터"),
    "cm": ("cm", "centimeter", "centimeters", "centimetre", "centimetres", "센티미터", "센티"),
    "mm": ("mm", "millimeter", "millimeters"),
    "ft": ("ft", "foot", "feet", "피트"),
    "in": ("inch", "inches", "인치"),
    "yd": ("yd", "yard", "yards"),
    "kg": ("kg", "kgs", "kilogram", "kilograms", "kilo", "kilos", "킬로그램"),
    "g": ("gram", "grams", "그램"),
    "lb": ("lb", "lbs", "pound", "pounds", "파운드"),
    "oz": ("oz", "ounce", "ounces", "온스"),
    "l": ("liter", "liters", "litre", "litres", "리터"),
    "ml": ("ml", "milliliter", "milliliters", "millilitre", "millilitres"),
    "gal": ("gal", "gallon", "gallons", "갤런"),
    "cup": ("cup", "cups"),
    "tbsp": ("tbsp", "tablespoon", "tablespoons"),
    "tsp": ("tsp", "teaspoon", "teaspoons"),
    "c": ("c", "celsius", "centigrade", "°c", "℃", "섭씨"),
    "f": ("f", "fahrenheit", "°f", "℉", "화씨"),
    "k": ("kelvin",),
    "usd": ("usd", "dollar", "dollars", "$", "달러"),
    "eur": ("eur", "euro", "euros", "€", "유로"),
    "gbp": ("gbp", "sterling", "£", "파운드화"),
    "jpy": ("jpy", "yen", "¥", "엔"),
    "krw": ("krw", "won", "₩", "원화"),
    "cny": ("cny", "yuan", "rmb", "위안"),
    "btc": ("btc", "bitcoin", "bitcoins", "비트코인"),
    "mph": ("mph",), "kph": ("kph", "km/h", "kmh"),
    "gb": ("gb", "gigabyte", "gigabytes", "gib"), "mb": ("mb", "megabyte", "megabytes", "mib"),
    "tb": ("tb", "terabyte", "terabytes"), "kb": ("kb", "kilobyte", "kilobytes"),
    "bit": ("bit", "bits"), "byte": ("byte", "bytes"),
    "sec": ("sec", "secs", "second", "seconds", "초"), "min": ("minute", "minutes", "mins", "분"),
    "hour": ("hour", "hours", "hr", "hrs", "시간"), "day": ("day", "days", "일"),
    "week": ("week", "weeks", "주"), "month": ("month", "months", "개월"), "year": ("year", "years", "년"),
    "percent": ("percent", "%", "퍼센트"), "acre": ("acre", "acres"), "hectare": ("hectare", "hectares"),
    "sqft": ("sqft",), "calorie": ("calorie", "calories", "kcal", "칼로리"), "joule": ("joule", "joules"),
    "watt": ("watt", "watts", "w", "kw", "kilowatt", "kilowatts"), "volt": ("volt", "volts", "v"),
    "psi": ("psi",), "bar": ("bar",), "pa": ("pascal", "pascals", "kpa"),
    "deg": ("degree", "degrees", "°", "도"), "rad": ("radian", "radians"),
}
UNIT_OF = {spelling: unit for unit, spellings in UNITS.items() for spelling in spellings}
# Korean units are glued to what follows ("킬로미터인가요"): matched by prefix, longest first.
KO_UNITS = sorted((sp for sp in UNIT_OF if "\uac00" <= sp[0] <= "\ud7a3" and len(sp) > 1), key=len, reverse=True)
# Words that are units only next to a number ("in", "w", "v", "min", "second", "day" are ordinary words too).
UNIT_NEEDS_NUMBER = {"in", "w", "v", "bar", "min", "sec", "second", "seconds", "day", "days", "week", "weeks",
                      "month", "months", "year", "years", "hour", "hours", "g", "m", "c", "f", "k", "도", "분",
                      "초", "일", "주", "년", "엔", "won", "cup", "cups", "degree", "degrees"}

NEGATIONS = {"not", "no", "never", "n't", "cannot", "without", "none", "nobody", "nothing", "neither", "nor",
              "nowhere"}

# Pairs whose members flip an answer. Both members are also "polar": one appearing on one side only is a
# change of meaning even without its partner ("start the server" vs "run the server" is left to the
# substitution check; "how to start" vs "how to stop" is caught here).
ANTONYMS = [
    ("buy", "sell"), ("buying", "selling"), ("bought", "sold"), ("purchase", "sell"), ("accept", "decline"),
    ("accept", "reject"), ("approve", "reject"), ("approve", "deny"), ("allow", "deny"), ("allow", "block"),
    ("allow", "forbid"), ("permit", "forbid"), ("enable", "disable"), ("enabled", "disabled"), ("on", "off"),
    ("open", "close"), ("open", "closed"), ("opening", "closing"), ("start", "stop"), ("start", "end"),
    ("begin", "end"), ("beginning", "end"), ("starting", "stopping"), ("pause", "resume"), ("best", "worst"),
    ("better", "worse"), ("ascending", "descending"), ("asc", "desc"), ("increase", "decrease"),
    ("increasing", "decreasing"), ("raise", "lower"), ("rise", "fall"), ("up", "down"), ("upload", "download"),
    ("uploading", "downloading"), ("import", "export"), ("importing", "exporting"), ("input", "output"),
    ("inbound", "outbound"), ("incoming", "outgoing"), ("ingress", "egress"), ("add", "remove"), ("add", "delete"),
    ("adding", "removing"), ("insert", "delete"), ("create", "delete"), ("create", "destroy"),
    ("install", "uninstall"), ("installing", "uninstalling"), ("encrypt", "decrypt"), ("encryption", "decryption"),
    ("encode", "decode"), ("encoding", "decoding"), ("compress", "decompress"), ("compression", "decompression"),
    ("zip", "unzip"), ("lock", "unlock"), ("mount", "unmount"), ("subscribe", "unsubscribe"),
    ("follow", "unfollow"), ("like", "dislike"), ("love", "hate"), ("win", "lose"), ("won", "lost"),
    ("winning", "losing"), ("gain", "loss"), ("profit", "loss"), ("win", "loss"), ("pass", "fail"),
    ("passed", "failed"), ("success", "failure"), ("true", "false"), ("yes", "no"), ("right", "wrong"),
    ("correct", "incorrect"), ("valid", "invalid"), ("legal", "illegal"), ("safe", "unsafe"), ("safe", "dangerous"),
    ("healthy", "unhealthy"), ("possible", "impossible"), ("able", "unable"), ("likely", "unlikely"),
    ("visible", "invisible"), ("public", "private"), ("internal", "external"), ("inside", "outside"),
    ("indoor", "outdoor"), ("indoors", "outdoors"), ("above", "below"), ("over", "under"), ("before", "after"),
    ("early", "late"), ("earlier", "later"), ("earliest", "latest"), ("first", "last"), ("min", "max"),
    ("minimum", "maximum"), ("minimize", "maximize"), ("lowest", "highest"), ("low", "high"), ("lower", "higher"),
    ("least", "most"), ("less", "more"), ("fewer", "more"), ("small", "large"), ("small", "big"),
    ("smaller", "larger"), ("smaller", "bigger"), ("smallest", "largest"), ("smallest", "biggest"),
    ("short", "long"), ("shorter", "longer"), ("shortest", "longest"), ("slow", "fast"), ("slower", "faster"),
    ("slowest", "fastest"), ("cheap", "expensive"), ("cheaper", "pricier"), ("cheapest", "priciest"),
    ("hot", "cold"), ("warm", "cool"), ("hotter", "colder"), ("hottest", "coldest"), ("heat", "cool"),
    ("heating", "cooling"), ("wet", "dry"), ("light", "dark"), ("light", "heavy"), ("lighter", "heavier"),
    ("easy", "hard"), ("easy", "difficult"), ("easier", "harder"), ("simple", "complex"), ("old", "new"),
    ("older", "newer"), ("oldest", "newest"), ("young", "old"), ("younger", "older"), ("youngest", "oldest"),
    ("rich", "poor"), ("strong", "weak"), ("stronger", "weaker"), ("positive", "negative"), ("plus", "minus"),
    ("north", "south"), ("east", "west"), ("northern", "southern"), ("eastern", "western"), ("left", "right"),
    ("top", "bottom"), ("front", "back"), ("forward", "backward"), ("push", "pull"), ("send", "receive"),
    ("sending", "receiving"), ("sent", "received"), ("give", "take"), ("lend", "borrow"), ("lending", "borrowing"),
    ("borrow", "repay"), ("deposit", "withdraw"), ("debit", "credit"), ("arrive", "depart"),
    ("arrival", "departure"), ("arrivals", "departures"), ("enter", "exit"), ("entrance", "exit"),
    ("login", "logout"), ("log in", "log out"), ("sign in", "sign out"), ("connect", "disconnect"),
    ("online", "offline"), ("attach", "detach"), ("include", "exclude"), ("including", "excluding"),
    ("inclusive", "exclusive"), ("with", "without"), ("always", "never"), ("all", "none"), ("everyone", "nobody"),
    ("everything", "nothing"), ("same", "different"), ("similar", "different"), ("equal", "unequal"),
    ("sync", "async"), ("synchronous", "asynchronous"), ("static", "dynamic"), ("mutable", "immutable"),
    ("sorted", "unsorted"), ("ordered", "unordered"), ("signed", "unsigned"), ("upper", "lower"),
    ("uppercase", "lowercase"), ("major", "minor"), ("male", "female"), ("man", "woman"), ("men", "women"),
    ("boy", "girl"), ("husband", "wife"), ("mother", "father"), ("son", "daughter"), ("brother", "sister"),
    ("king", "queen"), ("day", "night"), ("morning", "evening"), ("am", "pm"), ("sunrise", "sunset"),
    ("summer", "winter"), ("spring", "autumn"), ("spring", "fall"), ("past", "future"), ("yesterday", "tomorrow"),
    ("ancient", "modern"), ("odd", "even"), ("prefix", "suffix"), ("head", "tail"), ("leading", "trailing"),
    ("client", "server"), ("frontend", "backend"), ("read", "write"), ("reading", "writing"), ("get", "set"),
    ("getter", "setter"), ("serialize", "deserialize"), ("marshal", "unmarshal"), ("merge", "split"),
    ("join", "split"), ("expand", "collapse"), ("show", "hide"), ("maximize", "minimize"), ("zoom in", "zoom out"),
    ("include", "omit"), ("to", "from"), ("pros", "cons"), ("advantages", "disadvantages"),
    ("benefits", "drawbacks"), ("cause", "effect"), ("question", "answer"), ("구매", "판매"), ("매수", "매도"),
    ("사다", "팔다"), ("최고", "최저"), ("최대", "최소"), ("오름차순", "내림차순"), ("증가", "감소"), ("상승", "하락"), ("켜기", "끄기"),
    ("켜다", "끄다"), ("열기", "닫기"), ("입력", "출력"), ("업로드", "다운로드"), ("수입", "수출"), ("찬성", "반대"), ("장점", "단점"),
    ("안전", "위험"), ("오전", "오후"), ("아침", "저녁"), ("낮", "밤"), ("여름", "겨울"), ("북쪽", "남쪽"), ("동쪽", "서쪽"), ("왼쪽", "오른쪽"),
    ("위", "아래"), ("앞", "뒤"), ("시작", "종료"), ("로그인", "로그아웃"), ("가입", "탈퇴"), ("추가", "삭제"), ("암호화", "복호화"),
    ("압축", "해제"), ("설치", "삭제"), ("설치", "제거"), ("시작", "중지"), ("시작", "정지"), ("생성", "삭제"), ("읽기", "쓰기"),
    ("충전", "방전"), ("입금", "출금"), ("승인", "거절"), ("허용", "차단"), ("활성화", "비활성화"), ("찬성", "반대"), ("합격", "불합격"),
    ("흑자", "적자"), ("상한", "하한"), ("going up", "going down"), ("go up", "go down"), ("goes up", "goes down"),
    ("went up", "went down"), ("turn on", "turn off"), ("switch on", "switch off"),
]
# Korean verbs and adjectives that flip an answer, by stem (사다 -> 사): their conjugated forms are derived in the
# verifier (사/산/살/삽니다/샀어요, 팔/판/팝니다/팔아요), and each form is read as the stem plus 다 ("사다").
KO_VERB_ANTONYMS = [
    ("사", "팔"), ("켜", "끄"), ("켜지", "꺼지"), ("올리", "내리"), ("오르", "내리"), ("올라가", "내려가"), ("늘리", "줄이"),
    ("늘어나", "줄어들"), ("키우", "줄이"), ("열", "닫"), ("열리", "닫히"), ("잠그", "열"), ("높이", "낮추"), ("빌려주", "빌리"),
    ("보내", "받"), ("가르치", "배우"), ("알", "모르"), ("읽", "쓰"), ("넣", "빼"), ("더하", "빼"), ("입", "벗"), ("붙이", "떼"),
    ("크", "작"), ("빠르", "느리"), ("높", "낮"), ("싸", "비싸"), ("많", "적"), ("길", "짧"), ("쉽", "어렵"), ("덥", "춥"),
    ("좋", "나쁘"), ("무겁", "가볍"), ("밝", "어둡"), ("넓", "좁"), ("뜨겁", "차갑"), ("두껍", "얇"), ("강하", "약하"),
    ("따뜻하", "시원하"), ("비싸", "저렴하"), ("길", "단축하"),
]
# ㅂ-irregular stems: 쉽 -> 쉬운, 쉬워 (the ㅂ becomes 우/워 before a vowel).
KO_B_IRREGULAR = {"쉽", "어렵", "덥", "춥", "무겁", "가볍", "어둡", "뜨겁", "차갑", "두껍", "귀엽", "즐겁", "더럽", "부드럽"}
ANTONYMS += [(f"{a}다", f"{b}다") for a, b in KO_VERB_ANTONYMS]
POLAR = {w for pair in ANTONYMS for w in pair if " " not in w} - {"to", "from", "on", "in", "over", "up", "down",
                                                                      "with", "get", "back", "right", "left",
                                                                      "light", "like", "even", "take", "give",
                                                                      "set", "question", "answer", "all", "day", "am", "pm",
                                                                      "fall", "spring", "read", "top", "head"}
OPPOSITE: dict[str, set[str]] = {}
for _a, _b in ANTONYMS:
    OPPOSITE.setdefault(_a, set()).add(_b)
    OPPOSITE.setdefault(_b, set()).add(_a)

TIME_WORDS = {
    "today", "tomorrow", "yesterday", "tonight", "morning", "afternoon", "evening", "night",
    "midnight", "noon", "weekend", "weekday", "daily", "weekly", "monthly",
    "yearly", "annually", "hourly", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
    "january", "february", "march", "april", "june", "july", "august", "september", "october",
    "november", "december", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    "spring", "summer", "autumn", "fall", "winter", "next", "last", "previous", "upcoming", "past", "future",
    "오늘", "내일", "어제", "모레", "그제", "지금", "현재", "아침", "점심", "저녁", "밤", "새벽", "오전", "오후", "정오", "자정",
    "주말", "평일", "월요일", "화요일", "수요일", "목요일", "금요일", "토요일", "일요일", "봄", "여름", "가을", "겨울",
    "다음", "지난", "이번", "올해", "내년", "작년", "재작년", "내후년", "그저께", "글피", "어젯밤", "이따", "나중", "방금", "아까",
    "올", "다다음", "새해", "연말", "연초", "월말", "월초", "상반기", "하반기", "분기", "낮", "초순", "중순", "하순",
}
# Korean "this/next/last" + a period, written as one word or two (이번 주 / 이번주, 지난달): one time word.
KO_TIME_PREFIXES = {"이번": "이번", "다음": "다음", "지난": "지난", "저번": "지난", "다다음": "다다음", "올": "올"}
KO_TIME_PERIODS = {"주", "달", "해", "주말", "학기", "분기", "월", "년", "시즌", "번"}

COMPARATIVES = {
    "more", "most", "less", "least", "fewer", "fewest", "better", "best", "worse", "worst", "higher", "highest",
    "lower", "lowest", "larger", "largest", "bigger", "biggest", "smaller", "smallest", "faster", "fastest",
    "slower", "slowest", "cheaper", "cheapest", "longer", "longest", "shorter", "shortest", "older", "oldest",
    "newer", "newest", "earlier", "earliest", "later", "latest", "greater", "greatest", "safer", "safest",
    "easier", "easiest", "harder", "hardest", "stronger", "strongest", "weaker", "weakest", "richer",
    "richest", "poorer", "poorest", "hotter", "hottest", "colder", "coldest", "warmer", "warmest", "cooler",
    "coolest", "heavier", "heaviest", "lighter", "lightest", "popular", "top", "max", "min", "maximum",
    "minimum", "more than", "less than", "최고", "최저", "최대", "최소", "가장", "더", "덜", "제일",
}
# Korean bounds: comparatives only after a number ("180 이상"; 이상한 is "strange").
KO_BOUNDS = ("이상", "이하", "초과", "미만")
EST_NOT_SUPERLATIVE = {"interest", "test", "request", "rest", "est", "forest", "honest", "suggest", "digest",
                        "manifest", "harvest", "protest", "contest", "invest", "latest", "guest", "quest",
                        "chest", "nest", "west", "vest", "pest", "modest", "arrest", "ingest", "unrest",
                        "attest", "midwest", "conquest", "backtest", "pytest", "jest", "priest", "crest"}

# Words a rephrasing may add, drop or swap freely: they do not change what is asked.
FILLER = {
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "being", "am", "do", "does", "did", "doing",
    "have", "has", "had", "i", "me", "my", "we", "our", "you", "your", "it", "its", "this", "that", "these",
    "those", "there", "here", "what", "what's", "which", "who", "whom", "whose", "how", "why", "when", "where",
    "can", "could", "would", "should", "will", "shall", "may", "might", "must", "please", "kindly", "tell",
    "explain", "describe", "show", "give", "let", "know", "want", "need", "like", "wondering", "wonder",
    "curious", "question", "quick", "help", "hi", "hello", "hey", "thanks", "thank", "so", "just", "really",
    "actually", "basically", "exactly", "some", "any", "about", "regarding", "on", "of", "for", "to", "in",
    "at", "by", "as", "and", "or", "if", "then", "than", "also", "too", "very", "much", "many", "way", "ways",
    "best way", "get", "go", "going", "possible", "someone", "somebody", "one", "s", "'s", "us", "they",
    "them", "their", "he", "she", "his", "her", "with", "from", "into", "onto", "up", "out", "over",
    "info", "information", "details", "detail", "overview", "guide", "steps", "step", "process",
    "procedure", "method", "methods", "approach", "mean", "means", "meaning", "definition", "define",
    "work", "works", "working", "use", "used", "using", "make", "made", "sure", "okay", "ok", "well",
    "은", "는", "이", "가", "을", "를", "좀", "요", "주세요", "알려줘", "알려주세요", "뭐야", "뭔가요", "무엇인가요", "어때요",
    "어때", "어떻게", "하나요", "해요", "있나요", "인가요", "가요", "까요", "궁금해요", "말해줘",
    "알", "알려", "주", "하", "되", "있", "수", "것", "거", "뭐", "뭔", "무엇", "무슨", "어떤", "어느", "어디", "얼마나", "혹시",
    "제발", "그냥", "법", "방법", "하는", "방식", "싶", "궁금", "설명", "말해", "가르쳐", "보", "봐", "해", "되는", "할",
    "그", "저", "제", "나", "내", "저희", "우리", "너", "당신", "요즘", "정말", "진짜", "꼭", "같", "대해", "관해",
    "대한", "관련", "위한", "위해", "때문", "경우", "정도", "한번", "잘", "어떻", "말", "해줘", "줄래",
}
SYNONYMS = [
    {"big", "large", "huge"}, {"small", "little", "tiny"}, {"fast", "quick", "rapid", "speedy"},
    {"buy", "purchase"}, {"begin", "start", "commence"}, {"end", "finish", "conclude"},
    {"fix", "repair", "resolve", "solve"}, {"error", "exception"}, {"make", "create", "build", "generate"},
    {"obtain", "get", "acquire", "retrieve", "fetch"}, {"find", "locate", "discover", "look"},
    {"need", "require"}, {"use", "utilize", "employ"}, {"car", "automobile", "vehicle"},
    {"picture", "photo", "image"}, {"movie", "film"}, {"doctor", "physician"}, {"job", "work", "career"},
    {"task", "job"}, {"help", "assist", "support"}, {"change", "modify", "alter", "update", "edit"},
    {"remove", "delete", "erase"}, {"show", "display", "print", "list", "view", "see"},
    {"configure", "setup", "set", "configuration", "config"}, {"install", "setup"},
    {"function", "method"}, {"folder", "directory"}, {"app", "application", "program"},
    {"handle", "manage", "deal"}, {"allowed", "permitted"}, {"cost", "price"}, {"correct", "right"},
    {"explain", "describe", "clarify"}, {"quickly", "fast"}, {"difference", "differences", "differ"},
    {"benefit", "advantage"}, {"issue", "problem"}, {"choose", "select", "pick"}, {"run", "execute"},
    {"connect", "link"}, {"check", "verify", "validate"}, {"speed", "performance"},
    {"dataset", "datasets", "data"}, {"model", "models"}, {"library", "package"}, {"all", "every", "each"},
    {"quit", "exit", "leave"}, {"see", "check", "view"}, {"make", "write", "create"},
    {"wrote", "author", "authored", "writer", "written"}, {"painted", "painter"}, {"invented", "inventor"},
    {"discovered", "discoverer"}, {"tall", "height"}, {"founded", "founder"}, {"directed", "director"}, {"composed", "composer"},
    {"가장", "제일"}, {"오류", "에러", "error"}, {"삭제", "제거", "지우"}, {"변경", "바꾸", "수정"}, {"크기", "용량", "사이즈"},
    {"추천", "골라", "고르", "골"}, {"방법", "법", "하는법"}, {"고치", "해결", "수리"}, {"확인", "체크"}, {"사진", "이미지"}, {"영상", "동영상", "비디오"},
    {"만들", "생성", "만드"}, {"시작", "개시"}, {"가격", "값", "비용"}, {"환전", "바꾸", "변환", "환산"},
]
SYNONYM_OF: dict[str, set[str]] = {}
for _group in SYNONYMS:
    for _w in _group:
        SYNONYM_OF.setdefault(_w, set()).update(_group)

# Common words that may start a sentence capitalised without being a name.
COMMON_STARTERS = {
    "what", "how", "why", "when", "where", "who", "which", "is", "are", "can", "could", "would", "should",
    "do", "does", "did", "will", "please", "tell", "explain", "describe", "give", "show", "list", "convert",
    "translate", "write", "find", "i", "my", "the", "a", "an", "in", "on", "for", "to", "from", "with", "best",
    "worst", "any", "some", "if", "hi", "hello", "hey", "quick", "compare", "calculate", "define", "summarize",
    "create", "make", "get", "set", "use", "using", "recommend", "suggest", "name", "help", "let", "it", "this",
    "that", "there", "weather", "time", "price", "cost", "steps", "ways", "difference", "top", "average",
    "distance", "population", "history", "capital", "meaning", "definition", "by", "at", "as",
}
PLACES = {
    # A small gazetteer for lower-cased place names; capitalised ones are caught as entities anyway.
    "london", "manchester", "liverpool", "birmingham", "leeds", "glasgow", "edinburgh", "bristol", "paris",
    "lyon", "marseille", "berlin", "munich", "hamburg", "frankfurt", "madrid", "barcelona", "rome", "milan",
    "venice", "naples", "amsterdam", "rotterdam", "brussels", "vienna", "zurich", "geneva", "prague",
    "warsaw", "budapest", "lisbon", "porto", "dublin", "oslo", "bergen", "stockholm", "copenhagen",
    "helsinki", "athens", "istanbul", "moscow", "kyiv", "cairo", "lagos", "nairobi", "johannesburg",
    "dubai", "mumbai", "delhi", "bangalore", "karachi", "beijing", "shanghai", "shenzhen", "hong kong",
    "tokyo", "osaka", "kyoto", "seoul", "busan", "incheon", "taipei", "singapore", "bangkok", "hanoi",
    "jakarta", "manila", "sydney", "melbourne", "auckland", "toronto", "vancouver", "montreal", "boston",
    "chicago", "seattle", "denver", "austin", "dallas", "houston", "miami", "atlanta", "phoenix", "portland",
    "nyc", "la", "sf", "mexico", "bogota", "lima", "santiago", "buenos aires", "rio", "sao paulo",
    "france", "germany", "spain", "italy", "england", "scotland", "wales", "ireland", "uk", "usa", "us",
    "canada", "japan", "china", "korea", "india", "brazil", "australia", "russia", "ukraine", "poland",
    "sweden", "norway", "denmark", "finland", "netherlands", "belgium", "switzerland", "austria", "greece",
    "turkey", "egypt", "nigeria", "kenya", "vietnam", "thailand", "indonesia", "philippines", "argentina",
    "서울", "부산", "대구", "인천", "광주", "대전", "울산", "세종", "제주", "수원", "창원", "고양", "용인", "성남", "청주",
    "전주", "포항", "강릉", "춘천", "경주", "여수", "일본", "중국", "미국", "영국", "한국", "도쿄", "오사카", "뉴욕", "런던", "파리",
}
# Korean particles (조사) and the role each gives the word it follows: where something comes from, where it goes, the
# object, the subject, what it is compared with, a possessor; None for those that mark no role (topic, "and", "also").
# Matched longest first; "c" / "v" say the particle follows only a consonant-final / vowel-final syllable
# (고양이 keeps its 이: 양 ends in a consonant but 이가 would be the particle), so a stem is not cut.
KO_PARTICLES: dict[str, tuple[str | None, str]] = {
    "에서부터": ("source", ""), "으로부터": ("source", "c"), "로부터": ("source", "v"), "에게서": ("source", ""),
    "한테서": ("source", ""), "에서는": ("source", ""), "에서도": ("source", ""), "에서만": ("source", ""),
    "에서": ("source", ""), "부터는": ("source", ""), "부터": ("source", ""),
    "으로는": ("destination", "c"), "으로도": ("destination", "c"), "으로만": ("destination", "c"), "으로": ("destination", "c"),
    "로는": ("destination", "v"), "로도": ("destination", "v"), "로만": ("destination", "v"), "로": ("destination", "v"),
    "까지는": ("destination", ""), "까지만": ("destination", ""), "까지": ("destination", ""), "에게는": ("destination", ""),
    "에게": ("destination", ""), "한테는": ("destination", ""), "한테": ("destination", ""), "께": ("destination", ""),
    "에는": ("destination", ""), "에도": ("destination", ""), "에만": ("destination", ""), "에": ("destination", ""),
    "만을": ("object", ""), "을": ("object", "c"), "를": ("object", "v"),
    "께서": ("subject", ""), "만이": ("subject", ""), "이": ("subject", "c"), "가": ("subject", "v"),
    "보다는": ("than", ""), "보다": ("than", ""), "의": ("of", ""), "만의": ("of", ""),
    "은": (None, "c"), "는": (None, "v"), "도": (None, ""), "만은": (None, ""), "만": (None, ""), "과": (None, "c"),
    "와": (None, "v"), "이랑": (None, "c"), "랑": (None, "v"), "처럼": (None, ""), "마다": (None, ""),
    "이나": (None, "c"), "나": (None, "v"), "이든": (None, "c"), "든": (None, "v"), "이라도": (None, "c"), "라도": (None, "v"),
}
KO_PARTICLE_ORDER = sorted(KO_PARTICLES, key=len, reverse=True)
# Words that end in 만 without it being the particle "only".
KO_MAN_NOUNS = {"비만", "불만", "자만", "교만", "충만", "오만", "거만", "기만", "미만", "이만", "만만", "풍만", "태만", "간만", "천만",
                "백만", "십만", "수만", "수십만", "수백만", "금만", "조만", "방만", "원만", "팽만"}
# Syllables a Korean predicate ends in (endings, the copula, 하다/되다): stripped from the end of a word to reach the
# part a rephrasing keeps ("해결합니까" and "해결해요" -> 해결; "포유류인가요" -> 포유류).
KO_ENDING_SYLLABLES = set("요까니다나죠세시어아여해했합함하한할돼됩됐된될되됨줘줬주는면고서게지네야라습려으냐데던입인예에래봐겠었았였도기은을며자든군구임가뇨렴")
# Endings after a verb form (켜 + 는, 꺼 + 줘, 삽 + 니다, 살 + 까요); two may follow each other (켜 + 려 + 면).
KO_VERB_ENDINGS = {
    "", "다", "요", "고", "는", "은", "을", "면", "으면", "려면", "으려면", "려고", "으려고", "러", "으러", "자", "지", "지요", "죠", "게",
    "게요", "기", "기를", "기는", "기가", "기도", "세요", "으세요", "시", "셨", "십시오", "나요", "니", "니까", "니다", "냐", "네",
    "네요", "던", "는데", "은데", "서", "도", "야", "줘", "줘요", "주세요", "줄래", "라", "까", "까요", "래", "래요", "거", "건", "습니다",
    "습니까", "는지", "은지", "지만", "아", "어", "면서", "다가", "기로", "고요", "군요", "구나", "어요", "아요", "어서", "아서", "어도",
    "아도", "어야", "아야", "도록", "대", "든", "든지", "거나", "잖아", "잖아요", "는다", "다면", "려", "려는", "으려는", "이", "히",
    "음", "다고", "냐고", "라고", "봐", "볼까", "볼까요", "가요", "ㄴ가요", "는가요", "은가요", "나", "지는", "지도", "질", "진", "져",
    "졌", "줄", "주", "준", "고서", "는다면", "기에", "데", "때",
}
# Native Korean numerals: full forms count anywhere, the short forms (한, 두, 세, 네, 열 ...) only before a counter.
KO_NATIVE_UNITS = {"하나": 1, "둘": 2, "셋": 3, "넷": 4, "다섯": 5, "여섯": 6, "일곱": 7, "여덟": 8, "아홉": 9}
KO_NATIVE_SHORT = {"한": 1, "두": 2, "세": 3, "석": 3, "서": 3, "네": 4, "넉": 4}
KO_NATIVE_TENS = {"열": 10, "스물": 20, "스무": 20, "서른": 30, "마흔": 40, "쉰": 50, "예순": 60, "일흔": 70, "여든": 80, "아흔": 90}
KO_SINO_DIGITS = {"영": 0, "공": 0, "일": 1, "이": 2, "삼": 3, "사": 4, "오": 5, "육": 6, "륙": 6, "칠": 7, "팔": 8, "구": 9}
KO_SINO_PLACES = {"십": 10, "백": 100, "천": 1000}
KO_SINO_GROUPS = {"만": 10_000, "억": 100_000_000, "조": 1_000_000_000_000}
# Counters (단위 명사): a numeral before one of these is a number ("세 개", "일곱 시", "2인분").
KO_COUNTERS = ("인분", "번째", "개월", "시간", "마리", "켤레", "송이", "그릇", "군데", "가지", "페이지", "킬로", "키로", "퍼센트", "학년",
               "교시", "세기", "개국", "조각", "봉지", "개", "명", "시", "분", "초", "번", "살", "권", "대", "잔", "병", "장", "벌", "달",
               "주", "일", "년", "월", "층", "원", "째", "곳", "통", "줄", "칸", "쪽", "배", "세", "도", "점", "회", "차", "위", "등",
               "호", "박", "알", "캔", "팩", "판", "채", "척", "억", "만", "천", "백", "달러", "엔", "리터", "미터", "그램")
# Counters a bare Sino-Korean digit may take (오 분, 삼 년); 시, 번, 대 take native numerals, and 이번/일시 are words.
KO_SINO_COUNTERS = ("인분", "개월", "퍼센트", "킬로", "학년", "교시", "세기", "분", "초", "원", "년", "월", "일", "층", "세", "도",
                    "점", "회", "차", "위", "등", "호", "주", "달러", "엔", "만", "억", "천", "백")
KO_NOT_NUMBERS = {"이분", "구분", "일도", "이도", "사도", "오도", "이주", "일주", "이월", "사월", "오월", "이등", "일등", "이차", "일차",
                  "이호", "이점", "일점", "사점", "오점", "사위", "이위", "일회", "이회", "오차", "사차", "구월", "이세", "사세", "일세",
                  "이천", "일천", "이만", "오만", "사백", "이백", "일만", "오일", "이일", "삼일", "구일", "사일", "칠일", "팔일",
                  "세대", "세월", "한도", "한층", "열차", "열대", "열도", "사주", "구도", "구차", "이원", "일원", "사원", "구원",
                  "사회", "이년", "구세", "구호", "오호", "한정", "두부", "세상", "한국", "세계", "일부", "이상", "이하", "일시",
                  "한번쯤", "세분", "일반", "사은", "이번", "이분법", "한편", "한때", "사이", "오후", "오전"}
# Korean spellings of names written in Latin letters elsewhere (아이폰 = iphone): read as the Latin name.
KO_LOANWORDS = {
    "아이폰": "iphone", "아이패드": "ipad", "맥북": "macbook", "맥": "mac", "에어팟": "airpods", "갤럭시": "galaxy",
    "파이썬": "python", "자바스크립트": "javascript", "타입스크립트": "typescript", "자바": "java", "코틀린": "kotlin",
    "스위프트": "swift", "러스트": "rust", "고랭": "golang", "루비": "ruby", "깃허브": "github", "깃랩": "gitlab", "깃": "git",
    "도커": "docker", "쿠버네티스": "kubernetes", "리눅스": "linux", "우분투": "ubuntu", "윈도우": "windows", "윈도우즈": "windows",
    "안드로이드": "android", "크롬": "chrome", "사파리": "safari", "파이어폭스": "firefox", "엑셀": "excel", "워드": "word",
    "파워포인트": "powerpoint", "유튜브": "youtube", "넷플릭스": "netflix", "구글": "google", "애플": "apple", "아마존": "amazon",
    "마이크로소프트": "microsoft", "리액트": "react", "뷰": "vue", "노드": "node", "장고": "django", "플라스크": "flask",
    "포스트그레스": "postgres", "마이에스큐엘": "mysql", "레디스": "redis", "몽고디비": "mongodb", "엔진엑스": "nginx",
    "깃허브액션": "github actions", "액션": "actions", "슬랙": "slack", "줌": "zoom", "노션": "notion", "카카오톡": "kakaotalk",
    "카톡": "kakaotalk", "인스타그램": "instagram", "인스타": "instagram", "페이스북": "facebook", "트위터": "twitter",
    "테슬라": "tesla", "삼성": "samsung", "엔비디아": "nvidia", "인텔": "intel", "챗지피티": "chatgpt", "판다스": "pandas",
    "넘파이": "numpy", "텐서플로": "tensorflow", "파이토치": "pytorch", "에이더블유에스": "aws", "아마존웹서비스": "aws",
    "브이에스코드": "vscode", "스프링": "spring", "오라클": "oracle", "블루투스": "bluetooth", "와이파이": "wifi",
}

# Quantifiers by what they claim: some member, every member, or none. Two questions that quantify the same
# thing differently ("where any item is late" / "where every item is late") ask different things.
QUANTIFIERS = {
    "any": "some", "some": "some", "anything": "some", "anyone": "some", "anybody": "some", "something": "some",
    "someone": "some", "somebody": "some", "either": "some", "exists": "some",
    "every": "all", "all": "all", "each": "all", "everything": "all", "everyone": "all", "everybody": "all",
    "both": "all", "entire": "all", "whole": "all",
    "no": "none", "none": "none", "nothing": "none", "nobody": "none", "neither": "none",
    "most": "most", "majority": "most", "few": "few",
    "아무": "some", "일부": "some", "몇몇": "some", "일부분": "some",
    "모든": "all", "모두": "all", "전부": "all", "전체": "all", "다": "all", "싹": "all", "몽땅": "all",
    "각": "each", "매": "each", "각각": "each",
    "~만": "only", "하나만": "only", "오직": "only", "단지": "only", "뿐": "only",
    "대부분": "most", "대다수": "most",
}

# "to" after these words starts a verb ("how to copy", "want to move"), not a destination.
INFINITIVE_CUES = {
    "how", "want", "wants", "wanted", "need", "needs", "way", "ways", "able", "try", "trying", "tried", "have", "has",
    "going", "used", "like", "possible", "best", "easiest", "fastest", "simplest", "order", "supposed", "where",
    "what", "when", "who", "why", "whether", "learn", "easy", "hard", "safe", "better", "time", "steps", "plan",
}
